"""Container launch overhead: `true` with and without `--image`, side by side on one pool.

The jobs_e2e workload (`true`, 0.25 GPU each, on one simulated 8-GPU node, every job a real process
as the tenant's account) in alternating rounds on the same `gpupool up`: a round of JOBS on the node
itself, then a round of JOBS in a tiny busybox image (built here from Debian's busybox-static and
imported through the API: nothing is pulled), ROUNDS times. Each round first submits SERIAL jobs one
at a time, each waited for, for the p50 and p90 of submit-to-running (its `submitted` event to its
`running` event, both the server's clock: the launch, not the queue), then JOBS at once for the jobs/s
(first submission to all ended). `running` is marked when the pod's process starts (the shim, which
then starts crun); for `true`, running -> ended is what the container adds around the command. The
ratios are image / host.

    sudo .venv/bin/python bench/image_launch.py [--jobs 200] [--serial 20] [--rounds 3]

Needs root (pods run as the tenants' accounts), crun and busybox-static (`make test-deps`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from _control_plane import RawHttpClient, gpupool_up, write_json
from jobs_e2e import _wait_all_done

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from factories import busybox_image_tar, static_busybox

SIDES = ("host", "image")


async def _submit(url: str, token: str, jobs: int, spec: dict[str, object],
                  concurrency: int = 8) -> list[str]:
    clients = [RawHttpClient(url) for _ in range(concurrency)]
    request = clients[0].request_bytes("POST", "/api/v1/workloads", token, spec)
    ids: list[str] = []
    todo = list(range(jobs))

    async def worker(client: RawHttpClient) -> None:
        while todo:
            todo.pop()
            status, body = await client.send(request)
            if status != 201:
                raise RuntimeError(f"submission refused ({status}): {body.decode(errors='replace')}")
            ids.append(json.loads(body)["id"])

    try:
        await asyncio.gather(*(worker(c) for c in clients))
    finally:
        for c in clients:
            await c.close()
    return ids


def _phases_ms(c: httpx.Client, ids: list[str]) -> tuple[list[float], list[float]]:
    """Each job's submitted -> running (its process started) and running -> succeeded (for `true`:
    what setting up and tearing down its container costs), from its events (the server's clock)."""
    to_running, run = [], []
    for workload_id in ids:
        events = c.get(f"/api/v1/workloads/{workload_id}/events").json()
        submitted = min(e["at_s"] for e in events)
        running = [e["at_s"] for e in events if e["to_status"] == "running"]
        ended = [e["at_s"] for e in events if e["to_status"] == "succeeded"]
        if running and ended:
            to_running.append((min(running) - submitted) * 1000)
            run.append((max(ended) - min(running)) * 1000)
    return to_running, run


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200, help="jobs per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per side, alternating")
    parser.add_argument("--serial", type=int, default=20,
                        help="jobs per round submitted one at a time (each waited for): the p50 and p90")
    parser.add_argument("--json", default="")
    opts = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("crun") is None or static_busybox() is None:
        raise SystemExit("needs root, crun and busybox-static (make test-deps; run as root)")
    images = Path(tempfile.mkdtemp(prefix="gpupool-bench-images-", dir="/var/tmp"))
    os.chmod(images, 0o711)
    os.environ["GPUPOOL_IMAGE_DIR"] = str(images / "store")
    per_side: dict[str, dict[str, list[float]]] = {
        s: {"to_running_ms": [], "run_ms": [], "jobs_per_s": []} for s in SIDES}
    try:
        with gpupool_up("--simulate", "1x8xH100") as server, \
                httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"},
                             timeout=60) as c:
            c.post("/api/v1/images", params={"name": "tiny"}, content=busybox_image_tar()).raise_for_status()
            done = 0
            for _ in range(opts.rounds):
                for side in SIDES:
                    spec: dict[str, object] = {"command": ["true"], "resources": {"gpus": 0.25}}
                    if side == "image":
                        spec["image"] = "tiny"
                    for _ in range(opts.serial):  # one at a time: the launch, not the queue
                        ids = asyncio.run(_submit(server.url, server.token, 1, spec, concurrency=1))
                        done += 1
                        _wait_all_done(c, done, 60.0, server.data_dir)
                        to_running, run = _phases_ms(c, ids)
                        per_side[side]["to_running_ms"] += to_running
                        per_side[side]["run_ms"] += run
                    start = time.perf_counter()
                    asyncio.run(_submit(server.url, server.token, opts.jobs, spec))
                    done += opts.jobs
                    counts = _wait_all_done(c, done, 60.0, server.data_dir)
                    per_side[side]["jobs_per_s"].append(opts.jobs / (time.perf_counter() - start))
            failed = counts["failed"]
    finally:
        shutil.rmtree(images, ignore_errors=True)
    summary = {side: {"p50_to_running_ms": round(_quantile(v["to_running_ms"], 0.5), 1),
                      "p90_to_running_ms": round(_quantile(v["to_running_ms"], 0.9), 1),
                      "p50_running_to_ended_ms": round(_quantile(v["run_ms"], 0.5), 1),
                      "jobs_per_s_median": round(statistics.median(v["jobs_per_s"]), 1),
                      "jobs_per_s_rounds": [round(x, 1) for x in v["jobs_per_s"]]}
               for side, v in per_side.items()}
    image, host = summary["image"], summary["host"]
    ratios = {"p50_to_running": round(image["p50_to_running_ms"] / host["p50_to_running_ms"], 2),
              "running_to_ended": round(image["p50_running_to_ended_ms"]
                                        / host["p50_running_to_ended_ms"], 2),
              "jobs_per_s": round(image["jobs_per_s_median"] / host["jobs_per_s_median"], 2)}
    table = Table(title=f"`true` at 0.25 GPU on one simulated 8-GPU node, {opts.rounds} alternating rounds "
                        f"per side: {opts.serial} jobs one at a time, then {opts.jobs} at once")
    for column in ("side", "p50 submit->running ms (one at a time)", "p90 ms", "p50 running->ended ms",
                   "jobs/s (median of rounds)"):
        table.add_column(column)
    for side in SIDES:
        s = summary[side]
        table.add_row("on the node" if side == "host" else "--image tiny (crun)", str(s["p50_to_running_ms"]),
                      str(s["p90_to_running_ms"]), str(s["p50_running_to_ended_ms"]),
                      str(s["jobs_per_s_median"]))
    table.add_row("ratio image / host", str(ratios["p50_to_running"]), "", str(ratios["running_to_ended"]),
                  str(ratios["jobs_per_s"]))
    Console().print(table)
    result = {"jobs": opts.jobs, "serial": opts.serial, "rounds": opts.rounds, "failed": failed,
              "sides": summary, "ratios": ratios, "load_average_1m": os.getloadavg()[0]}
    print(f"JSON: {write_json(opts.json, 'image_launch', result)}")


if __name__ == "__main__":
    main()
