"""What travels: by-value pickling of the caller's own functions, the size limit, durations, options."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import cloudpickle
import pytest

import gpupool
from gpupool.api.calls import MAX_PAYLOAD_BYTES
from gpupool.errors import InvalidInput
from gpupool.remote import payload
from gpupool.remote.errors import CallCancelled, RemoteCallError
from gpupool.remote.options import Options


def triple(x: int) -> int:
    return 3 * x


def test_the_callers_own_module_travels_by_value_and_installed_ones_by_name() -> None:
    assert payload._own_module(sys.modules[__name__])  # a test module: not installed anywhere
    assert not payload._own_module(json)  # the standard library
    assert not payload._own_module(cloudpickle)  # site-packages
    assert not payload._own_module(gpupool)  # the pool has gpupool itself
    text = payload.dump_call(triple, (4,), {})
    load = ("import base64, sys, cloudpickle; "
            "f, a, k = cloudpickle.loads(base64.b64decode(sys.stdin.read())); print(f(*a))")
    ran = subprocess.run([sys.executable, "-P", "-c", load], input=text, capture_output=True, text=True,
                         cwd="/", env={"PATH": "/usr/bin:/bin"}, check=False)  # where this module is not
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "12"


def test_a_call_over_the_size_limit_is_refused_with_the_limit_in_words() -> None:
    with pytest.raises(InvalidInput, match=r"over the pool's limit of 16 MiB per call"):
        payload.dump_call(triple, (b"x" * (MAX_PAYLOAD_BYTES + 1),), {})


def test_outcomes() -> None:
    ok = {"id": "c-1", "session_id": "w-1", "status": "succeeded",
          "result": base64.b64encode(cloudpickle.dumps([1, 2])).decode()}
    assert payload.load_outcome(ok) == [1, 2]
    raised = {"id": "c-1", "session_id": "w-1", "status": "failed", "pod_id": "w-1-a1-r0",
              "result": base64.b64encode(cloudpickle.dumps(KeyError("k"))).decode(), "traceback": "TB-TEXT"}
    with pytest.raises(KeyError) as caught:
        payload.load_outcome(raised)
    assert "TB-TEXT" in "".join(caught.value.__notes__) and "w-1-a1-r0" in "".join(caught.value.__notes__)
    opaque = {**raised, "result": None, "error": "Odd: odd"}
    with pytest.raises(RemoteCallError, match="Odd: odd") as failed:
        payload.load_outcome(opaque)
    assert failed.value.remote_traceback == "TB-TEXT" and "Remote traceback" in str(failed.value)
    with pytest.raises(CallCancelled):
        payload.load_outcome({"id": "c-1", "session_id": "w-1", "status": "cancelled", "error": "Cancelled."})


@pytest.mark.parametrize(("text", "seconds"), [(90, 90.0), ("90", 90.0), ("30s", 30.0), ("10m", 600.0),
                                               ("2h", 7200.0), ("1d", 86400.0), (None, None)])
def test_durations(text: str | int | None, seconds: float | None) -> None:
    assert payload.parse_duration_s(text, "timeout") == seconds


@pytest.mark.parametrize("text", ["-1", "0", "ten minutes", "5x", float("nan")])
def test_bad_durations_say_what_is_expected(text: str | float) -> None:
    with pytest.raises(InvalidInput, match="positive duration such as"):
        payload.parse_duration_s(text, "timeout")


def test_options_make_the_session_body() -> None:
    options = Options.make(gpus=0.25, gpu_memory="8GiB", timeout="10m", queue="q").named("embed batch!")
    body = options.session_body(one_shot=True, payload="UA==")
    assert body["resources"] == {"gpus": 0.25, "gpu_memory": "8GiB", "cpu": 0, "memory": 0, "models": []}
    assert body["time_limit_s"] == 600.0 and body["queue"] == "q" and body["one_shot"] is True
    assert body["name"] == "fn-embed-batch" and body["call"] == {"payload": "UA=="}
    assert body["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"


def test_import_gpupool_stays_light() -> None:
    code = ("import sys, gpupool; "
            "print(sorted(m for m in sys.modules if m.startswith(('httpx', 'gpupool', 'pydantic'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['gpupool']"
