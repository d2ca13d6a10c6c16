"""Remote functions against a real server and real worker pods (local provider, simulated devices)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import gpupool
from gpupool.errors import Conflict, InvalidInput
from gpupool.remote import CallCancelled, RemoteCallError

from .conftest import RemotePool
from .support import GPU_VARS, until


def square(x: int) -> int:
    return x * x


def whereabouts() -> dict[str, object]:
    import os

    return {"env": dict(os.environ), "uid": os.getuid(), "pid": os.getpid()}


class BatchError(ValueError):
    pass


def explode(batch: list[int]) -> None:
    if len(batch) > 2:
        raise BatchError(f"batch of {len(batch)} is too large")


def unpicklable_failure() -> None:
    import threading

    class Odd(Exception):
        def __init__(self) -> None:
            super().__init__("odd failure")
            self.lock = threading.Lock()  # an exception that cannot be pickled

    raise Odd()


def sleepy(seconds: float) -> str:
    print("sleepy started", flush=True)
    time.sleep(seconds)
    return "woke"


def test_remote_returns_the_result_from_a_pod_inside_its_slice(remote_pool: RemotePool) -> None:
    with gpupool.connect(remote_pool.server.url, remote_pool.tokens["alice"]) as pool:
        remote_square = pool.function(square, gpus=0.25, timeout="5m")
        future = remote_square.remote(7)
        assert future.result(timeout=120) == 49
        assert remote_square(8) == 64  # a call is remote() then result()
        inside = pool.function(whereabouts, gpus=0.5, gpu_memory="8GiB").remote().result(timeout=120)
        # the result is back once the worker sent it, before its pod has ended: its end waited for
        workload = pool.client.wait(future.workload_id, timeout_s=60)
    env = inside["env"]
    assert isinstance(env, dict)
    assert env["CUDA_VISIBLE_DEVICES"].startswith("GPU-")  # the slice's device, by UUID
    assert env["GPUPOOL_DEVICE_MILLI"] == "500"
    assert remote_pool.tokens["alice"] not in json.dumps(env)  # never the tenant's own token
    assert env["GPUPOOL_CALL_TOKEN"].startswith("gpf_")
    if os.geteuid() == 0:
        assert env["USER"] == "gpupool-alice" and inside["uid"] != 0
    assert workload.status == "succeeded" and workload.tenant == "alice"  # an ordinary workload


def test_an_exception_comes_back_with_its_remote_traceback(remote_pool: RemotePool) -> None:
    with gpupool.connect(remote_pool.server.url, remote_pool.tokens["alice"]) as pool:
        with pytest.raises(BatchError, match="batch of 3 is too large") as raised:
            pool.function(explode, gpus=0.25)([1, 2, 3])
        note = "\n".join(getattr(raised.value, "__notes__", []))
        assert "Remote traceback" in note and "in explode" in note and "BatchError" in note
        with pytest.raises(RemoteCallError, match="Odd: odd failure") as odd:
            pool.function(unpicklable_failure, gpus=0.25)()
        assert "in unpicklable_failure" in odd.value.remote_traceback


def crash(code: int) -> None:
    os._exit(code)


def test_a_worker_that_dies_fails_its_call_saying_why(remote_pool: RemotePool) -> None:
    with gpupool.connect(remote_pool.server.url, remote_pool.tokens["alice"]) as pool:
        future = pool.function(crash, gpus=0.25).remote(3)
        died = f"workload {future.workload_id} failed before answering it"
        with pytest.raises(RemoteCallError, match=died):
            future.result(timeout=120)
        assert pool.client.workload(future.workload_id).status == "failed"
        assert "code 3" in str(future.exception())


def test_map_keeps_the_input_order(remote_pool: RemotePool) -> None:
    with gpupool.connect(remote_pool.server.url, remote_pool.tokens["alice"]) as pool:
        remote_square = pool.function(square, gpus=0.25)
        assert list(remote_square.map(range(12))) == [x * x for x in range(12)]
        assert list(remote_square.map([5, 1, 4, 2], concurrency=2)) == [25, 1, 16, 4]


def test_a_session_serves_many_calls_from_one_warm_pod(remote_pool: RemotePool) -> None:
    with gpupool.connect(remote_pool.server.url, remote_pool.tokens["alice"]) as pool:
        with pool.session(gpus=0.25) as session:
            pids = {session.call(whereabouts)["pid"] for _ in range(4)}
            futures = [session.submit(square, n) for n in range(5)]
            assert [f.result(timeout=60) for f in futures] == [0, 1, 4, 9, 16]
            assert len({pool._get_call(f.id, 0)["pod_id"] for f in futures}) == 1
            assert list(session.map(square, [3, 4])) == [9, 16]
        assert len(pids) == 1  # one worker process served every call
        until(lambda: pool.client.workload(session.id).status == "succeeded", 60, "the session's end")
        with pytest.raises(Conflict, match="closed"):
            session._pool._submit_call(session.id, "", 0.0)


def slow_the_first_time(marks: str) -> str:
    import os
    import time

    first = os.path.join(marks, "first")
    if not os.path.exists(first):
        open(first, "w").close()
        time.sleep(600)  # until its slice is preempted
    return "ran again"


def test_a_session_call_cut_off_by_preemption_runs_again_on_the_new_pod(
        remote_pool: RemotePool, pod_scratch_root: Path) -> None:
    marks = pod_scratch_root / "once"  # pods run as the tenant's account: a directory open to them
    marks.mkdir()
    marks.chmod(0o777)
    with gpupool.connect(remote_pool.server.url, remote_pool.tokens["alice"]) as pool, \
            pool.session(gpus=2, priority_class="best-effort") as session:  # every device of the pool
        future = session.submit(slow_the_first_time, str(marks))
        until(lambda: (marks / "first").exists(), 120, "the call's first attempt")
        high = pool.client.submit({"command": ["true"], "resources": {"gpus": 2},  # alice's own queue:
                                   "priority_class": "normal"})  # preemption stays within it
        assert future.result(timeout=180) == "ran again"
        assert pool.client.wait(high, timeout_s=60).status == "succeeded"
        call = pool._get_call(future.id, 0)
        assert call["attempts"] == 2 and call["status"] == "succeeded"
        reasons = [e.reason for e in pool.client.events(session.id)]
        assert any("preempt" in r for r in reasons), reasons


def test_cancelling_the_future_cancels_the_workload(remote_pool: RemotePool) -> None:
    with gpupool.connect(remote_pool.server.url, remote_pool.tokens["alice"]) as pool:
        future = pool.function(sleepy, gpus=0.25).remote(300)
        until(lambda: "sleepy started" in future.logs(), 120, "the call running (its log)")
        assert future.status in ("queued", "running")
        assert future.cancel()
        with pytest.raises(CallCancelled, match="cancelled"):
            future.result(timeout=30)
        assert pool.client.workload(future.workload_id).status == "cancelled"


def test_a_client_of_another_python_is_refused_before_anything_runs(
        remote_pool: RemotePool, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpupool.remote.options as options

    monkeypatch.setattr(options, "PYTHON", "3.9")
    with gpupool.connect(remote_pool.server.url, remote_pool.tokens["bob"]) as pool:
        before = pool.client.workloads().total
        with pytest.raises(InvalidInput) as refused:
            pool.function(square, gpus=0.25).remote(2)
        assert pool.client.workloads().total == before  # nothing was submitted
    message = refused.value.message
    pool_python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"runs Python 3.9 but the pool runs Python {pool_python}" in message
    assert message.count(". ") == 0 and message.endswith(".")  # one sentence


def test_a_call_from_a_process_with_no_gpu_variables(remote_pool: RemotePool, tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent("""
        import json, os
        import gpupool

        GPU_VARS = {gpu_vars!r}
        assert not any(os.environ.get(name) for name in GPU_VARS), "the client has GPU variables"
        pool = gpupool.connect()

        @pool.function(gpus=0.25, gpu_memory="8GiB", timeout="5m")
        def embed(batch):
            import os
            return [len(text) for text in batch], os.environ.get("CUDA_VISIBLE_DEVICES")

        sizes, device = embed.remote(["a", "bb", "ccc"]).result()
        with pool.session(gpus=0.25) as s:
            again = s.call(embed, ["dddd"])
        print(json.dumps({{"sizes": sizes, "device": device, "again": again[0]}}))
    """).format(gpu_vars=GPU_VARS))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GPUPOOL_URL": remote_pool.server.url,
           "GPUPOOL_TOKEN": remote_pool.tokens["bob"]}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["sizes"] == [1, 2, 3] and answer["again"] == [4]
    assert answer["device"].startswith("GPU-")


def test_a_finished_result_survives_a_server_restart(tmp_path: Path) -> None:
    from gpupool.client import Client
    from gpupool.providers.local import LocalProvider
    from live import live_server

    provider = LocalProvider(tmp_path / "agent", simulate="1xH100", node_name="box")
    try:
        with live_server(tmp_path, provider) as first, gpupool.connect(first.url, first.admin_token) as pool:
            call_id = pool.function(square, gpus=0.25).remote(12).id
            assert pool._get_call(call_id, 60)["status"] == "succeeded"
        with live_server(tmp_path, provider) as second, Client(second.url, first.admin_token) as admin, \
                gpupool.connect(second.url, first.admin_token) as pool:
            again = pool._get_call(call_id, 0)
            assert admin.health().status == "ok"
    finally:
        provider.agent.close(stop_pods=True)
    from gpupool.remote.payload import load_outcome

    assert load_outcome(again) == 144


def test_calls_on_postgresql(tmp_path: Path) -> None:
    from gpupool.providers.local import LocalProvider
    from gpupool.server import pgtemp
    from live import live_server
    from ports import free_port

    reason = pgtemp.why_unavailable()
    if reason:
        pytest.skip(f"PostgreSQL tests skipped: {reason}")
    postgres = pgtemp.start(free_port=free_port)
    provider = LocalProvider(tmp_path / "agent", simulate="1xH100", node_name="box")
    try:
        with live_server(tmp_path, provider, database_url=postgres.create_database()) as server, \
                gpupool.connect(server.url, server.admin_token) as pool:
            assert pool.function(square, gpus=0.25).remote(5).result(timeout=120) == 25
            with pool.session(gpus=0.25) as session:
                assert [session.call(square, n) for n in (2, 3)] == [4, 9]
                with pytest.raises(BatchError):
                    session.call(explode, [1, 2, 3])
    finally:
        provider.agent.close(stop_pods=True)
        postgres.stop()
