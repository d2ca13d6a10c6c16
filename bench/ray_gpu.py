"""Benchmark: a slice's environment on the ray provider, seen from inside a CUDA process on a real GPU.

Starts a Ray head here (RayProvider), joins THIS machine as a real node the way `gpupool node join`
does (NVML devices, no --simulate), and launches pods through the provider on device 0:
  1. bare use: gpu_isolation's matmul worker started directly (not through gpupool) on device 0,
     beside a whole-device slice (1000 milli) running the same worker through Ray: throughput
     overhead of the slice, target < 5 %;
  2. a 0.25-GPU / 8 GiB slice whose program reports from inside CUDA: CUDA_VISIBLE_DEVICES is the
     device's UUID, CUDA (the driver, and torch or cupy) sees exactly one device with that UUID, the
     MPS limits the agent sets for the slice are there (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
     CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, where the device's profile can cap MPS clients) and no RAY_*
     variable leaked in from Ray's processes; where an MPS daemon serves it, the pod can enter the
     daemon's pipe directory;
  3. a 12 GiB allocation inside another 8 GiB slice: enforced when it fails, recorded as "not
     enforced" when it succeeds (MPS limits need the MPS daemon; torch's cap needs torch).
Needs an NVIDIA GPU, ray, and torch or cupy in the pods' Python (--pod-python; where the agent runs
as root the pods run as other accounts, which must be able to run it). Elsewhere it says what is
missing, writes {"skipped": why} to the JSON and exits 0 without claiming anything. With a GPU it
exits 1 when the slice's environment check (2) fails, else 0. Nothing else depends on it.

    .venv/bin/python bench/ray_gpu.py [--seconds 10] [--pod-python PYTHON] [--out bench/results/ray_gpu.json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpupool.agent.isolation import mps_env
from gpupool.agent.probes.nvml import NvmlProbe, ProbeResult, ProbeStatus
from gpupool.core.model import Device, Slice
from gpupool.pods import PodLaunch, PodPhase
from gpupool.profiles import default_profiles
from gpupool.providers.base import Provider

sys.path.insert(0, str(Path(__file__).parent))
from _control_plane import write_json
from gpu_isolation import worker_command

NODE_NAME = "ray-gpu-bench"
SLICE = Slice(0, 250, 8192)
OVERSIZE_MIB = 12288
POD_TIMEOUT_S = 180.0

SLICE_PROBE = r"""
import ctypes, json, os
out = {"env": {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "GPUPOOL_", "RAY_", "NVIDIA_"))},
       "cuda_device_count": None, "cuda_uuids": [], "framework": None, "framework_device_count": None,
       "framework_uuids": [], "mps_pipe_reachable": None, "error": ""}
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
if pipe:
    out["mps_pipe_reachable"] = os.access(pipe, os.R_OK | os.W_OK | os.X_OK)
try:
    cuda = ctypes.CDLL("libcuda.so.1")
    rc = cuda.cuInit(0)
    if rc:
        raise RuntimeError("cuInit returned %d" % rc)
    count = ctypes.c_int()
    cuda.cuDeviceGetCount(ctypes.byref(count))
    out["cuda_device_count"] = count.value
    for ordinal in range(count.value):
        device, raw = ctypes.c_int(), (ctypes.c_ubyte * 16)()
        cuda.cuDeviceGet(ctypes.byref(device), ordinal)
        cuda.cuDeviceGetUuid(raw, device)
        h = bytes(raw).hex()
        out["cuda_uuids"].append("GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:]))
except Exception as exc:
    out["error"] = "CUDA driver: %s: %s" % (type(exc).__name__, str(exc)[:200])
for framework in ("torch", "cupy"):
    try:
        module = __import__(framework)
    except ImportError:
        continue
    out["framework"] = framework
    try:
        if framework == "torch":
            out["framework_device_count"] = module.cuda.device_count()
            out["framework_uuids"] = [str(getattr(module.cuda.get_device_properties(i), "uuid", ""))
                                      for i in range(module.cuda.device_count())]
        else:
            out["framework_device_count"] = module.cuda.runtime.getDeviceCount()
    except Exception as exc:
        out["error"] += " %s: %s: %s" % (framework, type(exc).__name__, str(exc)[:200])
    break
print(json.dumps(out), flush=True)
"""


# ---- judging (pure: tested without a GPU) ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SliceExpectation:
    """What the slice's process must see: its device and the MPS limit variables the agent sets."""

    device_uuid: str
    mps_env: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Verdict:
    """Failed checks, one sentence each; none means the report passed."""

    reasons: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.reasons


def expected_mps_env(piece: Slice, device: Device) -> dict[str, str]:
    """The MPS client limits the agent gives a slice of this one device (its isolation plan's own
    rule, without the daemon's pipe variables)."""
    env, _ = mps_env([(piece, device)], default_profiles(), None)
    return env


def _uuid_key(uuid: str) -> str:
    return uuid.strip().lower().removeprefix("gpu-")


def _one_device(kind: str, count: object, uuids: list[str], expected: str) -> list[str]:
    reasons = []
    if count != 1:
        reasons.append(f"{kind} sees {count} devices, not exactly the slice's one.")
    if uuids and [_uuid_key(u) for u in uuids] != [_uuid_key(expected)]:
        reasons.append(f"{kind} sees device(s) {', '.join(uuids)}, not the slice's {expected}.")
    return reasons


def judge_slice_report(report: Mapping[str, Any], expected: SliceExpectation) -> Verdict:
    """Check what a slice's CUDA process reported (SLICE_PROBE's JSON) against the slice."""
    reasons: list[str] = []
    if report.get("error"):
        reasons.append(f"CUDA did not start cleanly in the pod ({report['error'].strip()}).")
    env: Mapping[str, str] = report.get("env") or {}
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible != expected.device_uuid:
        reasons.append(f"CUDA_VISIBLE_DEVICES is {visible!r}, not the slice's device {expected.device_uuid}.")
    reasons += _one_device("The CUDA driver", report.get("cuda_device_count"),
                           list(report.get("cuda_uuids") or []), expected.device_uuid)
    if report.get("framework"):
        framework_uuids = [u for u in report.get("framework_uuids") or [] if u]
        reasons += _one_device(str(report["framework"]), report.get("framework_device_count"),
                               framework_uuids, expected.device_uuid)
    for name, value in sorted(expected.mps_env.items()):
        if env.get(name) != value:
            reasons.append(f"{name} is {env.get(name)!r}, not {value!r} as the slice asks.")
    if report.get("mps_pipe_reachable") is False:
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY")
        reasons.append(f"The pod cannot enter the MPS daemon's pipe directory {pipe}, so its MPS limits "
                       "are not enforced.")
    leaked = sorted(name for name in env if name.startswith("RAY_"))
    if leaked:
        reasons.append(f"Ray's variables reached the pod: {', '.join(leaked)}.")
    return Verdict(tuple(reasons))


def memory_cap_result(oversize: Mapping[str, Any]) -> str:
    """'enforced' when the allocation beyond the cap failed, 'not enforced' when it succeeded."""
    if oversize.get("alloc_ok") is False:
        return "enforced"
    if oversize.get("alloc_ok") is True:
        return "not enforced"
    last = str(oversize.get("error", "")).strip().split(" | ")[-1][-160:]  # the error's last line
    return f"unknown (pod {oversize.get('phase', '?')}: {last})"


def overhead_pct(bare_iters_per_s: float | None, slice_iters_per_s: float | None) -> float | None:
    """How much slower the slice ran than the bare process, in percent (None without both)."""
    if not bare_iters_per_s or not slice_iters_per_s:
        return None
    return (1 - slice_iters_per_s / bare_iters_per_s) * 100


def what_is_missing(probe: ProbeResult, modules: Collection[str], pod_modules: Collection[str],
                    pod_python: str) -> list[str]:
    """What this bench needs and this machine lacks, given NVML's answer, the modules this Python
    can import and those the pods' Python can."""
    missing = []
    if probe.status is not ProbeStatus.OK:
        missing.append(f"an NVIDIA GPU ({probe.message.strip().rstrip('.')})")
    if "ray" not in modules:
        missing.append("ray in this Python (pip install 'gpupool[ray]')")
    if "torch" not in pod_modules and "cupy" not in pod_modules:
        missing.append(f"torch or cupy in the pods' Python ({pod_python}; choose another with --pod-python)")
    return missing


def importable(python: str, modules: Collection[str]) -> set[str]:
    """Which of `modules` the interpreter `python` finds (none when it cannot be run)."""
    if python == sys.executable:
        return {m for m in modules if importlib.util.find_spec(m) is not None}
    code = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m)))"
    try:
        done = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return set(done.stdout.split()) if done.returncode == 0 else set()


# ---- measuring (needs the GPU) ---------------------------------------------------------------------
def run_pods(provider: Provider, pods: list[PodLaunch], timeout_s: float = POD_TIMEOUT_S) -> dict[str, dict]:
    """Launch the pods, wait for them to end (stopping them after `timeout_s`), parse each one's last
    stdout line as JSON."""
    for pod in pods:
        provider.launch(pod)
    deadline, stopping = time.monotonic() + timeout_s, False
    while True:
        statuses = {s.pod_id: s for s in provider.poll()}
        if all(p.pod_id in statuses and statuses[p.pod_id].phase.is_final for p in pods):
            break
        if time.monotonic() > deadline:
            if stopping:
                raise SystemExit(f"Pods {', '.join(p.pod_id for p in pods)} did not end, even when stopped.")
            for pod in pods:
                provider.stop(pod.pod_id, grace_s=5)
            deadline, stopping = time.monotonic() + 60, True
        time.sleep(0.2)
    results = {}
    for pod in pods:
        status = statuses[pod.pod_id]
        lines = provider.read_log(pod.pod_id).text.strip().splitlines()
        result: dict[str, Any] = {}
        with contextlib.suppress(ValueError, IndexError):
            result = json.loads(lines[-1]) if status.phase is PodPhase.SUCCEEDED else {}
        result.update(phase=status.phase.value, exit_code=status.exit_code)
        if not result.get("error") and status.phase is not PodPhase.SUCCEEDED:
            result["error"] = " | ".join([status.message, *lines[-5:]])
        results[pod.pod_id] = result
    return results


def worker(python: str, seconds: float, alloc_mib: int = 0) -> tuple[str, ...]:
    """gpu_isolation's worker (a timed matmul loop, or one allocation) run by `python`."""
    return (python, *worker_command(seconds, alloc_mib)[1:])


def run_bare(python: str, device_uuid: str, seconds: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_MPS_", "RAY_"))}
    env["CUDA_VISIBLE_DEVICES"] = device_uuid
    done = subprocess.run(worker(python, seconds), env=env, capture_output=True, text=True,
                          timeout=seconds * 4 + 120, check=False)
    if done.returncode != 0:
        return {"error": done.stderr[-400:]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def isolation_layers(data_dir: Path, pod_id: str) -> list[dict[str, Any]]:
    """What each isolation layer did for the pod, as the node's agent recorded it (same machine)."""
    for path in data_dir.rglob(f"{pod_id}/isolation.json"):
        return list(json.loads(path.read_text()))
    return []


def quit_mps_daemons(data_dir: Path) -> None:
    """Quit the MPS daemon the node's agent started (stopping its Ray node does not)."""
    binary = shutil.which("nvidia-cuda-mps-control")
    if binary is None:
        return
    for pipe in data_dir.rglob("mps/pipe"):
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
               "CUDA_MPS_LOG_DIRECTORY": str(pipe.parent / "log")}
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run([binary], input="quit\n", env=env, capture_output=True, text=True, timeout=15,
                           check=False)


def join_this_machine(provider: Any, data_dir: Path) -> Device:
    """Join this machine as a real node (as `gpupool node join` does); its device 0 once listed."""
    from gpupool.providers.ray.join import start_node
    from gpupool.providers.ray.nodeconfig import NodeConfig

    config = NodeConfig(name=NODE_NAME, state_dir=str(data_dir / "ray-nodes" / NODE_NAME),
                        pool_id=provider.pool_id)
    joined = start_node(provider.address, provider.token_path, config)
    provider.joined.append(joined)  # the provider stops its Ray worker node on close
    deadline = time.monotonic() + 60
    while NODE_NAME not in {n.name for n in provider.nodes()}:
        if time.monotonic() > deadline:
            raise SystemExit(f"The provider did not list node {NODE_NAME} within 60 s of its join.")
        time.sleep(0.1)
    joined.agent_ready()
    node = next(n for n in provider.nodes() if n.name == NODE_NAME)
    return next(d for d in node.devices if d.index == SLICE.device_index)


def measure(seconds: float, python: str) -> dict[str, Any]:
    from gpupool.providers.ray import RayProvider

    data_dir = Path(tempfile.mkdtemp(prefix="gpupool-ray-gpu-"))
    provider = RayProvider(data_dir=data_dir)
    try:
        device = join_this_machine(provider, data_dir)

        def pod(pod_id: str, piece: Slice, command: tuple[str, ...]) -> PodLaunch:
            return PodLaunch(pod_id=pod_id, workload_id=pod_id, node=NODE_NAME, command=command,
                             slices=(piece,))

        # Whole device and bare first: no fractional pod has started the MPS daemon yet.
        bare = run_bare(python, device.uuid, seconds)
        whole = run_pods(provider, [pod("whole", Slice(SLICE.device_index, 1000),
                                        worker(python, seconds))], seconds * 4 + POD_TIMEOUT_S)["whole"]
        checks = run_pods(provider, [pod("slice", SLICE, (python, "-c", SLICE_PROBE)),
                                     pod("oversize", SLICE, worker(python, 0, OVERSIZE_MIB))])
        layers = {p: isolation_layers(data_dir, p) for p in ("whole", "slice", "oversize")}
    finally:
        provider.close(stop_pods=True)
        quit_mps_daemons(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
    expected = SliceExpectation(device.uuid, expected_mps_env(SLICE, device))
    verdict = judge_slice_report(checks["slice"], expected)
    return {"measured": True, "node": NODE_NAME, "pod_python": python,
            "device": {"uuid": device.uuid, "model": device.model},
            "slice": {"compute_milli": SLICE.compute_milli, "memory_mib": SLICE.memory_mib,
                      "expected_mps_env": dict(expected.mps_env), "report": checks["slice"],
                      "passed": verdict.passed, "reasons": list(verdict.reasons)},
            "memory_cap": {"allocation_mib": OVERSIZE_MIB, "result": memory_cap_result(checks["oversize"]),
                           "raw": checks["oversize"]},
            "throughput": {"seconds": seconds, "bare": bare, "whole_slice": whole,
                           "overhead_pct": overhead_pct(bare.get("iters_per_s"), whole.get("iters_per_s"))},
            "isolation_layers": layers}


def _layer(layers: list[dict[str, Any]], name: str) -> str:
    found = next((entry for entry in layers if entry.get("layer") == name), None)
    if found is None:
        return "no record"
    return f"{'in force' if found.get('active') else 'not in force'}: {found.get('detail', '')}"


def print_table(console: Console, result: dict[str, Any]) -> None:
    table = Table(title=f"ray provider on one real GPU ({result['device']['model']}), node joined here")
    for column in ("check", "result", "target"):
        table.add_column(column)
    slice_ = result["slice"]
    table.add_row("0.25 / 8 GiB slice env inside CUDA",
                  "passed" if slice_["passed"] else "FAILED: " + " ".join(slice_["reasons"]),
                  "one device, its UUID, MPS limits, no RAY_*")
    table.add_row("MPS daemon for the slice", _layer(result["isolation_layers"]["slice"], "mps"), "in force")
    cap = result["memory_cap"]["result"]
    table.add_row(f"{OVERSIZE_MIB // 1024} GiB allocation in an 8 GiB slice",
                  "failed (enforced)" if cap == "enforced" else cap, "fails")
    overhead = result["throughput"]["overhead_pct"]
    table.add_row("whole-device slice vs bare (same matmul worker)",
                  f"{overhead:.2f} % slower" if overhead is not None else "n/a", "< 5 %")
    console.print(table)
    pods = (result["slice"]["report"], result["memory_cap"]["raw"], result["throughput"]["whole_slice"])
    if any(pod.get("exit_code") == 127 for pod in pods):
        console.print(f"The pods could not run {result['pod_python']}: where the agent runs as root they run "
                      "as other accounts; give --pod-python a Python those accounts can run.")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each throughput run")
    parser.add_argument("--out", default="", help="the JSON file (default bench/results/ray_gpu.json)")
    parser.add_argument("--pod-python", default=sys.executable, help=(
        "the Python the pods and the bare run use, with torch or cupy (default: this one); where the "
        "agent runs as root, pods run as other accounts, which must be able to run it"))
    args = parser.parse_args()
    console = Console()
    probe = NvmlProbe()
    try:
        probed = probe.probe()
    finally:
        probe.close()
    missing = what_is_missing(probed, importable(sys.executable, ("ray",)),
                              importable(args.pod_python, ("torch", "cupy")), args.pod_python)
    if missing:
        reason = f"ray_gpu needs {'; '.join(missing)}. Nothing was measured."
        console.print(reason, soft_wrap=True)  # a path in it must stay whole when piped
        out = write_json(args.out, "ray_gpu", {"skipped": reason, "missing": missing})
        console.print(f"wrote {out}", soft_wrap=True)
        return 0
    result = measure(args.seconds, args.pod_python)
    print_table(console, result)
    out = write_json(args.out, "ray_gpu", result)
    console.print(f"wrote {out}")
    return 0 if result["slice"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
