"""`events -f` delivery latency under the jobs_e2e load: N clients follow GET /events/stream while
1,000 trivial jobs run end to end on a simulated 8-GPU node.

Latency is from an event's stored time (`at_s`, written in the transaction that records it) to the
moment a client reads its `data:` line, on the same machine's clock. Each round runs the same load
twice on fresh pools, alternating: without followers (the anchor) and with N followers, so the
cost the streams put on the pool (jobs/s, server CPU per job) is a ratio measured side by side.

    .venv/bin/python bench/events_stream.py [--jobs 1000] [--clients 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import httpx
from rich.console import Console
from rich.table import Table

from _control_plane import PLAIN_SPEC, gpupool_up, write_json
from jobs_e2e import _submit_all, _wait_all_done

FOLLOWERS_CATCH_UP_S = 60.0


class Follower:
    """One `follow=true` stream over a raw HTTP/1.0 connection (the body ends with the connection,
    no chunk framing to parse): what it received, and each event's delivery latency."""

    def __init__(self) -> None:
        self.latencies_s: list[float] = []
        self.ids: list[int] = []

    async def run(self, url: str, token: str, stop: asyncio.Event) -> None:
        host, _, port = url.split("://", 1)[1].partition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write((f"GET /api/v1/events/stream?follow=true HTTP/1.0\r\nHost: {host}:{port}\r\n"
                      f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n").encode())
        await writer.drain()
        try:
            while not stop.is_set():
                line = await reader.readline()
                if not line:
                    return
                if line.startswith(b"data:"):
                    event = json.loads(line[5:])
                    self.latencies_s.append(time.time() - float(event["at_s"]))
                    self.ids.append(int(event["id"]))
        finally:
            writer.close()


def _stored_ids(url: str, token: str) -> list[int]:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
        text = c.get("/api/v1/events/stream").text
    return [json.loads(line[5:])["id"] for line in text.splitlines() if line.startswith("data:")]


async def _round(jobs: int, clients: int) -> dict[str, object]:
    with gpupool_up("--simulate", "1x8xH100") as server:
        followers = [Follower() for _ in range(clients)]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(f.run(server.url, server.token, stop)) for f in followers]
        await asyncio.sleep(1.0)  # connected: a follow stream starts at the newest event (none yet)
        start, cpu_before = time.perf_counter(), server.cpu_s()
        await _submit_all(server.url, server.token, jobs, [PLAIN_SPEC])
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}) as c:
            counts = await asyncio.to_thread(_wait_all_done, c, jobs, 60.0, server.data_dir)
        total_s = time.perf_counter() - start
        cpu_s = server.cpu_s() - cpu_before
        stored = await asyncio.to_thread(_stored_ids, server.url, server.token) if clients else []
        deadline = time.monotonic() + FOLLOWERS_CATCH_UP_S
        while any(len(f.ids) < len(stored) for f in followers) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the last events are still on their way
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    latencies = sorted(s for f in followers for s in f.latencies_s)
    result: dict[str, object] = {
        "clients": clients, "jobs": jobs, "succeeded": counts["succeeded"],
        "jobs_per_s": round(jobs / total_s, 1), "server_cpu_ms_per_job": round(cpu_s * 1000 / jobs, 2),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    if clients:
        result |= {
            "events_stored": len(stored),
            "delivered": len(latencies),
            "missing": sum(len(set(stored) - set(f.ids)) for f in followers),
            "duplicated": sum(len(f.ids) - len(set(f.ids)) for f in followers),
            "out_of_order": sum(1 for f in followers
                                for a, b in zip(f.ids, f.ids[1:], strict=False) if b <= a),
            "latency_p50_ms": round(_pct(latencies, 50) * 1000, 1),
            "latency_p99_ms": round(_pct(latencies, 99) * 1000, 1),
            "latency_max_ms": round(latencies[-1] * 1000, 1) if latencies else None,
        }
    return result


def _pct(sorted_values: list[float], percent: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * percent / 100))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default="")
    opts = parser.parse_args()
    rounds: list[dict[str, object]] = []
    for _ in range(opts.rounds):
        for clients in (0, opts.clients):  # the anchor, then with followers, in every round
            rounds.append(asyncio.run(_round(opts.jobs, clients)))
    anchor = [r for r in rounds if r["clients"] == 0]
    followed = [r for r in rounds if r["clients"] == opts.clients]

    def median(rows: list[dict[str, object]], key: str) -> float:
        return float(statistics.median(float(r[key]) for r in rows))  # type: ignore[arg-type]

    summary: dict[str, object] = {
        "jobs_per_s_ratio": round(median(followed, "jobs_per_s") / median(anchor, "jobs_per_s"), 3),
        "server_cpu_per_job_ratio": round(median(followed, "server_cpu_ms_per_job")
                                          / median(anchor, "server_cpu_ms_per_job"), 3),
        "latency_p50_ms": median(followed, "latency_p50_ms"),
        "latency_p99_ms": median(followed, "latency_p99_ms"),
        "server_cpu_ms_per_job": median(followed, "server_cpu_ms_per_job"),
        "missing": sum(int(r["missing"]) for r in followed),  # type: ignore[call-overload]
        "duplicated": sum(int(r["duplicated"]) for r in followed),  # type: ignore[call-overload]
    }
    table = Table(title=f"{opts.jobs} x `true` at 0.25 GPU, 1 simulated 8-GPU node: {opts.clients} "
                        "events -f followers against none, alternating")
    for column in ("followers", "jobs/s", "server CPU ms/job", "delivered / stored x followers",
                   "missing", "dup", "p50 ms", "p99 ms", "max ms", "load"):
        table.add_column(column)
    for r in rounds:
        expected = int(r.get("events_stored", 0)) * int(r["clients"])  # type: ignore[call-overload]
        table.add_row(str(r["clients"]), str(r["jobs_per_s"]), str(r["server_cpu_ms_per_job"]),
                      f"{r.get('delivered', '-')} / {expected or '-'}", str(r.get("missing", "-")),
                      str(r.get("duplicated", "-")), str(r.get("latency_p50_ms", "-")),
                      str(r.get("latency_p99_ms", "-")), str(r.get("latency_max_ms", "-")),
                      str(r["load_average_1m"]))
    Console(width=150).print(table)
    print(f"with followers / without (medians): jobs/s x{summary['jobs_per_s_ratio']}, server CPU per job "
          f"x{summary['server_cpu_per_job_ratio']}; delivery p50 {summary['latency_p50_ms']} ms, "
          f"p99 {summary['latency_p99_ms']} ms")
    print(f"JSON: {write_json(opts.json, 'events_stream', {**summary, 'rounds': rounds})}")


if __name__ == "__main__":
    main()
