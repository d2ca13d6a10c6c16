"""CPU time of the control loop's steps, in process: the parts a step runs (time limits, arrivals,
the cycle, the decision applier, launching, recording the launches) without HTTP or a real pod.

    .venv/bin/python bench/loop_steps.py [--workloads 2000] [--nodes 64] [--json OUT.json]

On the fake provider (`--nodes` x 8 H100, launches inline) with a SQLite store: --workloads
submissions wait (of 1 GPU, of 1 GPU with a time limit, of 8: while the pool is full the cycles
record why the rest wait); the loop steps, and whenever what runs stopped changing, every running
pod exits, until each workload has been launched. Timed in the process's CPU time
(`time.process_time`), which other work on a shared machine stretches far less than the wall
clock. Compare commits with bench/side_by_side.py --metric step_cpu_ms_per_workload.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpupool.api.workloads import WorkloadSpec
from gpupool.pods import PodLaunch
from gpupool.providers.fake import FakeProvider
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops.control import ControlLoop
from gpupool.server.runtime import Runtime
from gpupool.server.services import workloads
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

ADMIN = Principal("admin", None)


class Counting(FakeProvider):
    """The fake provider, counting the launches it took."""

    launched = 0

    def launch(self, pod: PodLaunch) -> None:
        super().launch(pod)
        self.launched += 1


def run(workload_count: int, nodes: int, data_dir: Path) -> dict[str, float]:
    now = [1_000_000.0]
    url = f"sqlite:///{data_dir / 'store.sqlite'}"
    provider = Counting(f"{nodes}x8xH100", clock=lambda: now[0], duration_s=1e9)
    rt = Runtime(settings=Settings(data_dir=data_dir, database_url=url), store=Store.open(url),
                 provider=provider, clock=lambda: now[0])
    bootstrap(rt)
    loop = ControlLoop(rt)
    loop.recovered = loop.reconciler.recover()
    specs = [WorkloadSpec.model_validate({"command": ["train"], "resources": {"gpus": gpus}, **extra})
             for gpus, extra in ((1, {}), (1, {"time_limit_s": 3600}), (8, {}))]
    for i in range(workload_count):
        workloads.submit(rt, ADMIN, specs[i % len(specs)])
    steps = 0
    cpu = 0.0
    running = -1
    while provider.launched < workload_count:
        began = time.process_time()
        loop.step()
        cpu += time.process_time() - began
        steps += 1
        now[0] += 0.05
        pods = [status.pod_id for status in provider.poll() if status.phase.name == "RUNNING"]
        if len(pods) == running:  # what runs settled: it all ends
            for pod_id in pods:
                provider.stop(pod_id, grace_s=0)
        running = len(pods)
        assert steps < 100_000, "the workloads never all ran"
    rt.store.close()
    return {"steps": steps, "step_cpu_s": round(cpu, 3),
            "step_cpu_ms_per_workload": round(1000 * cpu / workload_count, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--json", type=Path, default=Path("bench/results/loop_steps.json"))
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        measured = run(opts.workloads, opts.nodes, Path(tmp))
    result = {"workloads": opts.workloads, "nodes": opts.nodes, **measured}
    table = Table(title=f"control loop steps: {opts.workloads} submissions on {opts.nodes}x8xH100 (CPU time)")
    keys = ("steps", "step_cpu_s", "step_cpu_ms_per_workload")
    for key in keys:
        table.add_column(key)
    table.add_row(*(str(result[k]) for k in keys))
    Console().print(table)
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
