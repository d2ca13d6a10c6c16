"""Remote-function call overhead: an empty function's round trip, warm session vs fresh slice.

Through `gpupool up --simulate` (the local provider; every pod a real process) on loopback, from
this process (the client, as a user's program would be). Four rows from one run, pairs in turns:
  http floor     GET /api/v1/health on the same connection (what one API round trip costs here)
  warm session   s.call(empty) on an open session (its worker pod already running)
  fresh slice    empty.remote().result(): a one-shot workload placed, started and answered
  plain workload submit `python -c pass` (the worker's interpreter) and wait until it succeeded
Target: warm-session p50 under 20 ms. Ratios: warm / http floor, fresh / plain workload.

    .venv/bin/python bench/remote_calls.py [--warm 200] [--fresh 10] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

import gpupool
from _control_plane import gpupool_up, write_json
from gpupool.server.services.calls import worker_python


def empty() -> None:
    return None


def _interleaved_ms(runs: int, first: Callable[[], object], second: Callable[[], object]
                    ) -> tuple[list[float], list[float]]:
    """Each timed `runs` times, one after the other in turn, so both see the same machine."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(runs):
        for once, into in ((first, times[0]), (second, times[1])):
            start = time.perf_counter()
            once()
            into.append((time.perf_counter() - start) * 1000)
    return times


def _summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"runs": len(times), "p50_ms": statistics.median(ordered), "p99_ms": p99,
            "mean_ms": statistics.fmean(ordered)}


def measure(warm: int, fresh: int) -> dict[str, dict[str, float]]:
    with gpupool_up("--simulate", "1x4xH100", "--placement", "first-fit") as server, \
            gpupool.connect(server.url, server.token) as pool:
        remote_empty = pool.function(empty, gpus=0.25)
        remote_empty()  # the first pod start pays for cold caches
        results: dict[str, dict[str, float]] = {}
        python, paths = worker_python()  # the interpreter (and paths) a function's pod runs with
        spec = {"command": [python, "-c", "pass"], "resources": {"gpus": 0.25},
                "env": {"PYTHONPATH": paths} if paths else {}}

        def plain() -> None:
            done = pool.client.wait(pool.client.submit(spec), timeout_s=120, poll_s=0.01)
            assert done.status == "succeeded", done.message

        with pool.session(gpus=0.25) as session:
            for _ in range(10):
                session.call(empty)
            floor, warm_times = _interleaved_ms(warm, pool.client.health, lambda: session.call(empty))
        results["http_floor"], results["warm_session"] = _summary(floor), _summary(warm_times)
        fresh_times, plain_times = _interleaved_ms(fresh, remote_empty, plain)
        results["fresh_slice"], results["plain_workload"] = _summary(fresh_times), _summary(plain_times)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=200, help="warm calls (and health requests)")
    parser.add_argument("--fresh", type=int, default=10, help="fresh-slice calls (and plain workloads)")
    parser.add_argument("--json", default="", help="where to write the JSON (default bench/results/)")
    args = parser.parse_args()
    results = measure(args.warm, args.fresh)
    ratios = {"warm_over_http_floor": results["warm_session"]["p50_ms"] / results["http_floor"]["p50_ms"],
              "fresh_over_plain_workload":
                  results["fresh_slice"]["p50_ms"] / results["plain_workload"]["p50_ms"]}
    table = Table(title="Remote call round trip (empty function, loopback)")
    for column in ("path", "runs", "p50 ms", "p99 ms", "mean ms"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for name, row in results.items():
        table.add_row(name.replace("_", " "), str(row["runs"]), f"{row['p50_ms']:.1f}",
                      f"{row['p99_ms']:.1f}", f"{row['mean_ms']:.1f}")
    console = Console()
    console.print(table)
    target = "met" if results["warm_session"]["p50_ms"] < 20 else "NOT met"
    console.print(f"warm p50 / http floor p50 = {ratios['warm_over_http_floor']:.1f}x; fresh p50 / plain "
                  f"workload p50 = {ratios['fresh_over_plain_workload']:.2f}x; warm p50 < 20 ms: {target}")
    path = write_json(args.json, "remote_calls", {"results": results, "ratios": ratios,
                                                  "warm_target_ms": 20, "warm_target": target})
    console.print(f"JSON: {path}")


if __name__ == "__main__":
    main()
