"""Wall time of `gpupool submit` as a command: p50 over N sequential calls (target <= 60 ms).

Anchor (quoted, not run here): one Slurm 22.05 `sbatch` call takes 10-15 ms p50 on the same class
of 2-core machine. Python's own start-up is measured beside it as the floor.

    .venv/bin/python bench/submit_cli.py [--calls 200]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from _control_plane import gpupool_up, p50_ms, percentile_ms, write_json

GPUPOOL = Path(sys.executable).parent / "gpupool"


def _time(argv: list[str], env: dict[str, str], calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", default="")
    opts = parser.parse_args()
    with gpupool_up("--provider", "fake", "--simulate", "1x8xH100") as server:
        env = {**os.environ, "GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token}
        floor = _time([sys.executable, "-c", "pass"], env, opts.calls)
        submit = _time([str(GPUPOOL), "submit", "--gpus", "0.25", "--", "true"], env, opts.calls)
    rows = {
        "python -c pass (floor)": floor,
        "gpupool submit --gpus 0.25 -- true": submit,
    }
    table = Table(title=f"{opts.calls} sequential calls (target p50 <= 60 ms; sbatch 10-15 ms, quoted)")
    for column in ("command", "p50 ms", "p90 ms", "max ms"):
        table.add_column(column)
    result = {}
    for name, samples in rows.items():
        result[name] = {
            "p50_ms": round(p50_ms(samples), 1),
            "p90_ms": round(percentile_ms(samples, 90), 1),
            "max_ms": round(max(samples) * 1000, 1),
        }
        table.add_row(name, *(str(v) for v in result[name].values()))
    Console().print(table)
    flat: dict[str, object] = {
        **result,  # flat keys too, for bench/side_by_side.py --metric
        "submit_p50_ms": result["gpupool submit --gpus 0.25 -- true"]["p50_ms"],
        "floor_p50_ms": result["python -c pass (floor)"]["p50_ms"],
        "load_average_1m": os.getloadavg()[0],
    }
    print(f"JSON: {write_json(opts.json, 'submit_cli', flat)}")


if __name__ == "__main__":
    main()
