"""Benchmark: does a slice's isolation hold on a real NVIDIA GPU with MPS?

Runs, through the local provider (so the pods get exactly the isolation the agent gives them):
  1. bare use: the matmul worker started directly, without the agent, on the whole device;
  2. a whole-device slice (1000 milli) through the agent: overhead against (1), target < 5 %;
  3. two pods at once on one device, 25 % / 8 GiB and 75 % / 24 GiB, under MPS: their throughput
     ratio should follow the compute share (about 1 : 3);
  4. an oversized allocation (12 GiB) inside the 8 GiB slice: it must fail.
Needs an NVIDIA GPU, nvidia-cuda-mps-control and torch or cupy. Elsewhere it says what is missing,
writes that to the JSON and exits 0 without claiming anything.

    python bench/gpu_isolation.py [--seconds 10] [--json bench/results/gpu_isolation.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpupool.agent.probes.nvml import NvmlProbe, ProbeStatus
from gpupool.core.model import Slice
from gpupool.pods import PodLaunch, PodPhase
from gpupool.providers.local import LocalProvider

WORKER = r"""
import json, os, sys, time
seconds, alloc_mib, size = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
out = {"framework": None, "iters_per_s": None, "alloc_ok": None, "error": ""}
try:
    import torch
    out["framework"] = "torch"
    if alloc_mib:
        try:
            block = torch.empty(alloc_mib * 2**20, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize(); out["alloc_ok"] = True; del block
        except Exception as exc:
            out["alloc_ok"], out["error"] = False, type(exc).__name__ + ": " + str(exc)[:200]
    else:
        a = torch.randn(size, size, device="cuda", dtype=torch.float16); b = torch.randn_like(a)
        torch.cuda.synchronize(); n = 0; start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(10): a @ b
            torch.cuda.synchronize(); n += 10
        out["iters_per_s"] = n / (time.perf_counter() - start)
except ImportError:
    import cupy
    out["framework"] = "cupy"
    if alloc_mib:
        try:
            block = cupy.empty(alloc_mib * 2**20, dtype=cupy.uint8); cupy.cuda.Device().synchronize()
            out["alloc_ok"] = True; del block
        except Exception as exc:
            out["alloc_ok"], out["error"] = False, type(exc).__name__ + ": " + str(exc)[:200]
    else:
        a = cupy.random.standard_normal((size, size), dtype=cupy.float32).astype(cupy.float16); b = a.copy()
        cupy.cuda.Device().synchronize(); n = 0; start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(10): a @ b
            cupy.cuda.Device().synchronize(); n += 10
        out["iters_per_s"] = n / (time.perf_counter() - start)
print(json.dumps(out), flush=True)
"""


def missing_requirements() -> list[str]:
    missing = []
    probe = NvmlProbe()
    result = probe.probe()
    probe.close()
    if result.status is not ProbeStatus.OK:
        missing.append(f"an NVIDIA GPU ({result.message})")
    if shutil.which("nvidia-cuda-mps-control") is None:
        missing.append("nvidia-cuda-mps-control (CUDA MPS)")
    if importlib.util.find_spec("torch") is None and importlib.util.find_spec("cupy") is None:
        missing.append("torch or cupy in this Python")
    return missing


def worker_command(seconds: float, alloc_mib: int = 0, size: int = 8192) -> tuple[str, ...]:
    return (sys.executable, "-c", WORKER, str(seconds), str(alloc_mib), str(size))


def run_pods(provider: LocalProvider, pods: list[PodLaunch], timeout_s: float) -> dict[str, dict[str, Any]]:
    for pod in pods:
        provider.launch(pod)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        statuses = {s.pod_id: s for s in provider.poll()}
        if all(statuses[p.pod_id].phase.is_final for p in pods):
            break
        time.sleep(0.2)
    results = {}
    for pod in pods:
        status = {s.pod_id: s for s in provider.poll()}[pod.pod_id]
        lines = provider.read_log(pod.pod_id).text.strip().splitlines()
        result = json.loads(lines[-1]) if lines and status.phase is PodPhase.SUCCEEDED else {}
        result["phase"], result["exit_code"] = status.phase.value, status.exit_code
        if not lines:
            result["error"] = provider.read_log(pod.pod_id, "stderr").text[-400:]
        results[pod.pod_id] = result
    return results


def measure(seconds: float) -> dict[str, Any]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
    bare_out = subprocess.run(worker_command(seconds), env=env, capture_output=True, text=True,
                              timeout=seconds * 4 + 120, check=False)
    bare = json.loads(bare_out.stdout.strip().splitlines()[-1]) if bare_out.returncode == 0 else {
        "error": bare_out.stderr[-400:]}
    with tempfile.TemporaryDirectory() as state:
        provider = LocalProvider(state, node_name="bench")
        try:
            node = provider.nodes()[0].name

            def pod(pod_id: str, piece: Slice, command: tuple[str, ...]) -> PodLaunch:
                return PodLaunch(pod_id=pod_id, workload_id=pod_id, node=node, command=command,
                                 slices=(piece,))

            whole = run_pods(provider, [pod("whole", Slice(0, 1000), worker_command(seconds))],
                             seconds * 4 + 120)
            shared = run_pods(provider, [pod("q25", Slice(0, 250, 8192), worker_command(seconds)),
                                         pod("q75", Slice(0, 750, 24576), worker_command(seconds))],
                              seconds * 8 + 180)
            oversize = run_pods(provider, [pod("over", Slice(0, 250, 8192), worker_command(0, 12288))], 120)
            layers = provider.agent.isolation_layers("q25")
        finally:
            provider.close(stop_pods=True)  # also quits the MPS daemon
    return {"bare": bare, "whole": whole["whole"], "q25": shared["q25"], "q75": shared["q75"],
            "oversize": oversize["over"], "layers_q25": layers}


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    bare, whole = raw["bare"].get("iters_per_s"), raw["whole"].get("iters_per_s")
    q25, q75 = raw["q25"].get("iters_per_s"), raw["q75"].get("iters_per_s")
    return {
        "whole_slice_overhead_pct": (1 - whole / bare) * 100 if bare and whole else None,
        "share_ratio_75_over_25": q75 / q25 if q25 and q75 else None,
        "oversize_allocation_failed": raw["oversize"].get("alloc_ok") is False,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each throughput run")
    parser.add_argument("--json", type=Path, default=Path("bench/results/gpu_isolation.json"))
    args = parser.parse_args()
    console = Console()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    missing = missing_requirements()
    if missing:
        console.print(f"gpu_isolation needs {'; '.join(missing)}. Nothing was measured.")
        args.json.write_text(json.dumps({"measured": False, "missing": missing}, indent=1))
        return 0
    raw = measure(args.seconds)
    summary = summarise(raw)
    table = Table(title="Slice isolation on one GPU (MPS)")
    for column in ("check", "result", "target"):
        table.add_column(column)
    overhead, ratio = summary["whole_slice_overhead_pct"], summary["share_ratio_75_over_25"]
    table.add_row("whole-device slice vs bare", f"{overhead:.2f} % slower" if overhead is not None else "n/a",
                  "< 5 %")
    table.add_row("throughput 75 % / 25 % slice", f"{ratio:.2f}x" if ratio is not None else "n/a", "about 3x")
    enforced = summary["oversize_allocation_failed"]
    table.add_row("12 GiB allocation in an 8 GiB slice",
                  "failed (enforced)" if enforced else "succeeded (NOT enforced)", "fails")
    console.print(table)
    args.json.write_text(json.dumps({"measured": True, "summary": summary, "raw": raw}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
