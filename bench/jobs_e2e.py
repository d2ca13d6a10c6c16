"""1,000 trivial jobs (`true`, 0.25 GPU each) on a simulated 8-GPU node, end to end.

From the first submission to the moment all have succeeded, through `gpupool up` with the local
provider: every job is a real process. Target >= 100 jobs/s. Anchor (quoted, not run here):
Slurm 22.05 with 8 GPUs as `shard` GRES runs the same at about 29 jobs/s with
batch_sched_delay=0 (11 jobs/s stock).

    .venv/bin/python bench/jobs_e2e.py [--jobs 1000] [--config FILE] [--mix plain|cohort] [--netns on|off]

--config FILE starts the pool with that configuration (`gpupool up --config`); --mix cohort submits
the mix of `_control_plane.workload_mix` (three tenants, three priority classes, some whole-device
jobs with a time limit) instead of one spec; bench/side_by_side.py --config-b compares two
configurations in alternating rounds. --netns sets the pool's GPUPOOL_POD_NETNS (as root, `auto`,
the default, gives every pod its own network namespace; a commit before namespaces ignores it), so
`bench/side_by_side.py --args-a "--netns off" --args-b "--netns on"` prices the namespaces. The JSON
also has the p50 and p99 of each job's submission to its start (the store's started_s - submit_s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from _control_plane import (
    MIXES,
    RawHttpClient,
    cycle_totals,
    ensure_tenants,
    gpupool_up,
    p50_ms,
    percentile_ms,
    submit_to_running_s,
    unusual_events,
    workload_mix,
    write_json,
)


async def _submit_all(url: str, token: str, jobs: int, specs: list[dict[str, object]],
                      concurrency: int = 8) -> None:
    """Submit `jobs` workloads (job i is specs[i % len]) over CONCURRENCY keep-alive connections
    (the minimal client of _control_plane.py: httpx would spend as much CPU as the server on the
    same two cores)."""
    clients = [RawHttpClient(url) for _ in range(concurrency)]
    requests = [clients[0].request_bytes("POST", "/api/v1/workloads", token, s) for s in specs]
    todo = list(range(jobs))[::-1]

    async def worker(client: RawHttpClient) -> None:
        while todo:
            index = todo.pop()
            status, body = await client.send(requests[index % len(requests)])
            if status != 201:
                raise RuntimeError(f"submission refused ({status}): {body.decode(errors='replace')}")

    try:
        await asyncio.gather(*(worker(c) for c in clients))
    finally:
        for c in clients:
            await c.close()


def _wait_all_done(c: httpx.Client, jobs: int, stall_s: float, data_dir: Path) -> dict[str, int]:
    """The pool's workload counts once `jobs` have ended; SystemExit when none ended for stall_s
    (the store copied first to a directory the message names, for a post-mortem)."""
    last_done, last_change = -1, time.monotonic()
    while True:
        counts: dict[str, int] = c.get("/api/v1/pool").json()["workloads"]
        done = counts["succeeded"] + counts["failed"] + counts["cancelled"]
        if done >= jobs:
            return counts
        if done != last_done:
            last_done, last_change = done, time.monotonic()
        elif time.monotonic() - last_change > stall_s:
            kept = Path(tempfile.mkdtemp(prefix="gpupool-stuck-"))
            for store in data_dir.glob("gpupool.sqlite*"):
                shutil.copy2(store, kept)
            raise SystemExit(f"no workload ended for {stall_s:g} s: the pool is stuck at {counts}; "
                             f"its store is copied to {kept}")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--config", default="", help="the pool's configuration file (gpupool up --config)")
    parser.add_argument("--mix", choices=MIXES, default="plain", help="what is submitted (see above)")
    parser.add_argument("--stall-s", type=float, default=60.0,
                        help="give up when no workload ended for this long (a stuck pool)")
    parser.add_argument("--netns", choices=("auto", "on", "off"), default="",
                        help="the pool's GPUPOOL_POD_NETNS (default: as the environment has it)")
    parser.add_argument("--json", default="")
    opts = parser.parse_args()
    config = ["--config", opts.config] if opts.config else []
    if opts.netns:
        os.environ["GPUPOOL_POD_NETNS"] = opts.netns  # `gpupool up` inherits it
        # a pod network of its own: a pool (or test) already on the default one would leave `auto` off
        os.environ.setdefault("GPUPOOL_POD_NETWORK", "10.244.0.0/16")
    with gpupool_up("--simulate", "1x8xH100", *config) as server:
        ensure_tenants(server, opts.mix)
        headers = {"Authorization": f"Bearer {server.token}"}
        start, cpu_before = time.perf_counter(), server.cpu_s()
        asyncio.run(_submit_all(server.url, server.token, opts.jobs, workload_mix(opts.mix)))
        submitted_s = time.perf_counter() - start
        with httpx.Client(base_url=server.url, headers=headers) as c:
            counts = _wait_all_done(c, opts.jobs, opts.stall_s, server.data_dir)
        total_s = time.perf_counter() - start
        server_cpu_s = server.cpu_s() - cpu_before
        events = unusual_events(server)
        cycles, cycle_s = cycle_totals(server)
        to_running = submit_to_running_s(server)
    result = {
        "jobs": opts.jobs,
        "config": opts.config or "defaults",
        "mix": opts.mix,
        "succeeded": counts["succeeded"],
        "failed": counts["failed"],
        "submit_phase_s": round(submitted_s, 2),
        "end_to_end_s": round(total_s, 2),
        "jobs_per_s": round(opts.jobs / total_s, 1),
        "server_cpu_ms_per_job": round(server_cpu_s * 1000 / opts.jobs, 2),
        "netns": os.environ.get("GPUPOOL_POD_NETNS", "") or "auto",
        "submit_to_running_p50_ms": round(p50_ms(to_running), 1),
        "submit_to_running_p99_ms": round(percentile_ms(to_running, 99), 1),
        "cycles": cycles,
        "cycle_s": round(cycle_s, 3),
        "events": events,
        "load_average_1m": os.getloadavg()[0],
    }
    what = "`true` at 0.25 GPU" if opts.mix == "plain" else "`true`, cohort mix"
    table = Table(title=f"{opts.jobs} x {what} on one simulated 8-GPU node, configuration "
                        f"{result['config']} (target >= 100 jobs/s)")
    for column in ("system", "jobs/s", "end to end s", "succeeded", "failed"):
        table.add_column(column)
    table.add_row(
        "gpupool (local provider, real processes)",
        str(result["jobs_per_s"]),
        str(result["end_to_end_s"]),
        str(result["succeeded"]),
        str(result["failed"]),
    )
    table.add_row("Slurm 22.05 shard GRES, batch_sched_delay=0 (quoted)", "~29", "", "", "")
    table.add_row("Slurm 22.05 shard GRES, stock (quoted)", "~11", "", "", "")
    Console().print(table)
    if events:
        print("events beside the routine ones: " + ", ".join(f"{k} {v}" for k, v in events.items()))
    print(f"JSON: {write_json(opts.json, 'jobs_e2e', result)}")


if __name__ == "__main__":
    main()
