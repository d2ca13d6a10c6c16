"""bench/ray_gpu.py without a GPU: it says what is missing and claims nothing; and its judgement of a
slice's CUDA process, fed with reports as that process would write them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpupool.agent.probes.nvml import NvmlProbe, ProbeResult, ProbeStatus
from gpupool.core.model import Device, Slice

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import ray_gpu  # noqa: E402

UUID = "GPU-c9c8cacf-a3ef-5dfd-bbbe-e73779a04620"
OTHER = "GPU-0b7e3c1a-5d2f-4e6b-9a8c-1f2e3d4c5b6a"
H200 = Device(uuid=UUID, model="H200", index=0, memory_mib=143771)
EXPECTED = ray_gpu.SliceExpectation(UUID, ray_gpu.expected_mps_env(Slice(0, 250, 8192), H200))


def report(**changes: Any) -> dict[str, Any]:
    """What SLICE_PROBE prints inside a correct 0.25 / 8 GiB slice of H200, with `changes`."""
    base: dict[str, Any] = {
        "env": {"CUDA_VISIBLE_DEVICES": UUID, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M", "GPUPOOL_POD_ID": "slice"},
        "cuda_device_count": 1, "cuda_uuids": [UUID], "framework": "torch", "framework_device_count": 1,
        "framework_uuids": [UUID.removeprefix("GPU-")], "mps_pipe_reachable": True, "error": "",
        "phase": "succeeded", "exit_code": 0}
    base.update(changes)
    return base


def test_without_a_gpu_the_script_says_what_is_missing_and_writes_skipped_json(tmp_path: Path) -> None:
    probe = NvmlProbe()
    try:
        if probe.probe().status is ProbeStatus.OK:
            pytest.skip("an NVIDIA GPU is here, so the script would measure instead of skipping")
    finally:
        probe.close()
    out = tmp_path / "ray_gpu.json"
    no_python = tmp_path / "no-python"
    done = subprocess.run([sys.executable, str(BENCH / "ray_gpu.py"), "--out", str(out),
                           "--pod-python", str(no_python)],
                          capture_output=True, text=True, timeout=120, check=False)
    said = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "ray_gpu needs an NVIDIA GPU (" in said
    assert f"torch or cupy in the pods' Python ({no_python}; choose another with --pod-python)" in said
    assert "Nothing was measured." in said
    written = json.loads(out.read_text())
    assert set(written) == {"skipped", "missing"}
    assert written["skipped"].startswith("ray_gpu needs an NVIDIA GPU (")
    assert written["missing"][0].startswith("an NVIDIA GPU (")
    assert written["missing"][-1].startswith("torch or cupy in the pods' Python")


def test_a_correct_report_passes() -> None:
    verdict = ray_gpu.judge_slice_report(report(), EXPECTED)
    assert verdict.passed, verdict.reasons


def test_the_slice_expects_the_agents_mps_limits() -> None:
    assert EXPECTED.mps_env == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M"}
    assert ray_gpu.expected_mps_env(Slice(0, 1000), H200) == {}
    assert ray_gpu.expected_mps_env(Slice(0, 500), H200) == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    assert ray_gpu.expected_mps_env(Slice(0, 250, 8192), Device(UUID, "no-such-model", 0)) == {}


@pytest.mark.parametrize(("changes", "reason"), [
    ({"env": {**report()["env"], "CUDA_VISIBLE_DEVICES": OTHER}}, f"CUDA_VISIBLE_DEVICES is '{OTHER}'"),
    ({"cuda_uuids": [OTHER]}, f"The CUDA driver sees device(s) {OTHER}, not the slice's {UUID}."),
    ({"framework_uuids": [OTHER.removeprefix("GPU-")]}, "torch sees device(s)"),
    ({"cuda_device_count": 2, "cuda_uuids": [UUID, OTHER]}, "The CUDA driver sees 2 devices"),
    ({"framework_device_count": 2}, "torch sees 2 devices"),
    ({"env": {**report()["env"], "RAY_ADDRESS": "10.0.0.1:6379", "RAY_AUTH_TOKEN_PATH": "/x"}},
     "Ray's variables reached the pod: RAY_ADDRESS, RAY_AUTH_TOKEN_PATH."),
    ({"env": {"CUDA_VISIBLE_DEVICES": UUID, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}},
     "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is '100', not '25'"),
    ({"env": {"CUDA_VISIBLE_DEVICES": UUID, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}},
     "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT is None, not '0=8192M'"),
    ({"error": "CUDA driver: RuntimeError: cuInit returned 100", "cuda_device_count": None, "cuda_uuids": []},
     "CUDA did not start cleanly in the pod (CUDA driver: RuntimeError: cuInit returned 100)."),
    ({"env": {**report()["env"], "CUDA_MPS_PIPE_DIRECTORY": "/state/mps/pipe"}, "mps_pipe_reachable": False},
     "cannot enter the MPS daemon's pipe directory /state/mps/pipe"),
], ids=["visible-devices", "driver-uuid", "framework-uuid", "two-devices", "framework-two-devices",
        "ray-variables", "thread-percentage", "no-memory-limit", "cuda-error", "mps-pipe-closed"])
def test_a_wrong_report_fails_with_its_reason(changes: dict[str, Any], reason: str) -> None:
    verdict = ray_gpu.judge_slice_report(report(**changes), EXPECTED)
    assert not verdict.passed
    assert any(reason in r for r in verdict.reasons), verdict.reasons


def test_a_pod_that_never_reported_fails() -> None:
    verdict = ray_gpu.judge_slice_report({"phase": "failed", "exit_code": 127, "error": "cannot start"},
                                         EXPECTED)
    assert not verdict.passed
    assert any("CUDA_VISIBLE_DEVICES is None" in r for r in verdict.reasons)


def test_the_memory_cap_is_judged_by_the_allocation_outcome() -> None:
    assert ray_gpu.memory_cap_result({"alloc_ok": False, "error": "OutOfMemoryError"}) == "enforced"
    assert ray_gpu.memory_cap_result({"alloc_ok": True}) == "not enforced"
    assert ray_gpu.memory_cap_result({"phase": "failed", "error": "boom"}) == "unknown (pod failed: boom)"


def test_overhead_compares_the_slice_with_the_bare_run() -> None:
    assert ray_gpu.overhead_pct(200.0, 190.0) == pytest.approx(5.0)
    assert ray_gpu.overhead_pct(200.0, 210.0) == pytest.approx(-5.0)
    assert ray_gpu.overhead_pct(None, 190.0) is None
    assert ray_gpu.overhead_pct(200.0, None) is None


def test_what_is_missing_names_each_absent_requirement() -> None:
    ok = ProbeResult(ProbeStatus.OK, "1 device")
    none = ProbeResult(ProbeStatus.NO_DRIVER, "no NVIDIA driver.")
    assert ray_gpu.what_is_missing(ok, {"ray"}, {"torch"}, "py") == []
    assert ray_gpu.what_is_missing(ok, {"ray"}, {"cupy"}, "py") == []
    assert ray_gpu.what_is_missing(none, set(), set(), "py") == [
        "an NVIDIA GPU (no NVIDIA driver)", "ray in this Python (pip install 'gpupool[ray]')",
        "torch or cupy in the pods' Python (py; choose another with --pod-python)"]


def test_importable_asks_the_given_interpreter(tmp_path: Path) -> None:
    assert ray_gpu.importable(sys.executable, ("json", "no_such_module_here")) == {"json"}
    assert ray_gpu.importable(str(tmp_path / "no-python"), ("json",)) == set()
