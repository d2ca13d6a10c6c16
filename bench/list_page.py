"""Bytes and time of one list page (`GET /workloads?limit=100`) over 100 workloads with large specs:
the summary page (the default) against whole workloads (`full=true`, what every page carried before).

The store is filled through the API (`gpupool up --provider fake`, its one node cordoned so the
workloads stay pending): each has a command of --command-kib KiB and an environment of --env-kib KiB.
Both pages are read N times, alternating, on one server in the same run.

    .venv/bin/python bench/list_page.py [--workloads 100] [--env-kib 96] [--command-kib 16] [--calls 20]
"""

from __future__ import annotations

import argparse
import os
import time

import httpx
from rich.console import Console
from rich.table import Table

from _control_plane import gpupool_up, p50_ms, write_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=100)
    parser.add_argument("--env-kib", type=int, default=96)
    parser.add_argument("--command-kib", type=int, default=16)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json", default="")
    opts = parser.parse_args()
    env = {f"V{i}": "e" * 1000 for i in range(opts.env_kib)}
    command = ["python", "-c", "pass", *("a" * 1000 for _ in range(opts.command_kib))]
    with gpupool_up("--provider", "fake", "--simulate", "1x8xH100") as server:
        headers = {"Authorization": f"Bearer {server.token}"}
        with httpx.Client(base_url=server.url + "/api/v1", headers=headers, timeout=120) as api:
            (node,) = api.get("/nodes").json()
            api.post(f"/nodes/{node['name']}/cordon").raise_for_status()
            for _ in range(opts.workloads):
                answer = api.post("/workloads", json={"command": command, "env": env,
                                                      "resources": {"gpus": 1}})
                if answer.status_code != 201:
                    raise SystemExit(f"submit answered {answer.status_code}: {answer.text[:300]}")
            pages = {"summary (default)": {"limit": opts.workloads},
                     "full=true (as before)": {"limit": opts.workloads, "full": "true"}}
            samples: dict[str, list[float]] = {name: [] for name in pages}
            sizes: dict[str, int] = {}
            for _ in range(opts.calls):
                for name, params in pages.items():
                    start = time.perf_counter()
                    answer = api.get("/workloads", params=params)
                    samples[name].append(time.perf_counter() - start)
                    answer.raise_for_status()
                    sizes[name] = len(answer.content)
                    assert len(answer.json()["items"]) == opts.workloads
    full, summary = "full=true (as before)", "summary (default)"
    table = Table(title=f"GET /workloads?limit={opts.workloads}: {opts.workloads} workloads, each "
                  f"{opts.command_kib} KiB of command + {opts.env_kib} KiB of environment")
    for column in ("page", "bytes", "p50 ms", "max ms"):
        table.add_column(column)
    results: dict[str, dict[str, float]] = {}
    for name in pages:
        results[name] = {"bytes": sizes[name], "p50_ms": round(p50_ms(samples[name]), 1),
                         "max_ms": round(max(samples[name]) * 1000, 1)}
        row = results[name]
        table.add_row(name, f"{sizes[name]:,}", f"{row['p50_ms']:g}", f"{row['max_ms']:g}")
    Console().print(table)
    bytes_ratio = sizes[full] / sizes[summary]
    time_ratio = results[full]["p50_ms"] / results[summary]["p50_ms"]
    print(f"summary page: {bytes_ratio:.0f}x smaller, {time_ratio:.1f}x faster (p50) than full=true")
    payload: dict[str, object] = {
        "workloads": opts.workloads, "env_kib": opts.env_kib, "command_kib": opts.command_kib,
        "calls": opts.calls, **results, "bytes_ratio_full_over_summary": round(bytes_ratio, 1),
        "p50_ratio_full_over_summary": round(time_ratio, 2), "load_average_1m": os.getloadavg()[0],
    }
    print(f"JSON: {write_json(opts.json, 'list_page', payload)}")


if __name__ == "__main__":
    main()
