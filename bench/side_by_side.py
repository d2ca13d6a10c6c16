"""Run a control-plane benchmark against this checkout and an earlier commit, alternately, in one run.

The machine is shared and noisy, so a figure means something only beside its anchor measured under
the same load: this checks out REF in a temporary git worktree, then runs the benchmark script
(with its own arguments) ROUNDS times for each side, alternating (ref, head, ref, head, ...), each
with the `gpupool` package of its side first on PYTHONPATH. It prints the per-round figures and the
ratio of the medians, and writes JSON under bench/results/.

  .venv/bin/python bench/side_by_side.py --ref HEAD~5 --rounds 3 -- bench/jobs_e2e.py --jobs 1000
  .venv/bin/python bench/side_by_side.py --ref HEAD~5 --metric submissions_per_s -- \\
      bench/api_load.py --total 2000 --backends sqlite
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, args: list[str], src: Path, out: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run([sys.executable, str(ROOT / script), *args, "--json", str(out)], env=env, check=True,
                   cwd=ROOT, stdout=subprocess.DEVNULL)
    data = json.loads(out.read_text())
    return dict(data)


def _figure(result: dict[str, object], metric: str) -> float:
    """`metric` from a benchmark's JSON (top level, or the first row of a `results`/`rows` list)."""
    if metric in result:
        return float(result[metric])  # type: ignore[arg-type]
    for key in ("results", "rows", "backends"):
        rows = result.get(key)
        if isinstance(rows, list) and rows and isinstance(rows[0], dict) and metric in rows[0]:
            return float(rows[0][metric])
        if isinstance(rows, dict):
            for row in rows.values():
                if isinstance(row, dict) and metric in row:
                    return float(row[metric])
    raise SystemExit(f"the benchmark's JSON has no {metric!r}; pick one with --metric "
                     f"(keys: {sorted(result)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", required=True, help="the earlier commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--metric", default="jobs_per_s",
                        help="the JSON figure(s) to compare, comma-separated (the first is the headline)")
    parser.add_argument("--json", default="")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    opts = parser.parse_args()
    bench = [a for a in opts.bench if a != "--"]
    if not bench:
        raise SystemExit("give the benchmark after --, e.g. -- bench/jobs_e2e.py --jobs 1000")
    script, args = bench[0], bench[1:]
    work = Path(tempfile.mkdtemp(prefix="gpupool-side-"))
    ref_tree = work / "ref"
    subprocess.run(["git", "worktree", "add", "--detach", str(ref_tree), opts.ref], cwd=ROOT, check=True,
                   capture_output=True)
    ref_sha = subprocess.run(["git", "rev-parse", "--short", opts.ref], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.strip()
    head_sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
    metrics = [m.strip() for m in opts.metric.split(",") if m.strip()]
    figures: dict[str, dict[str, list[float]]] = {m: {"ref": [], "head": []} for m in metrics}
    try:
        for round_no in range(opts.rounds):
            for side, src in (("ref", ref_tree / "src"), ("head", ROOT / "src")):
                result = _run(script, args, src, work / f"{side}-{round_no}.json")
                for metric in metrics:
                    figures[metric][side].append(_figure(result, metric))
                print(f"round {round_no + 1} {side}: "
                      + ", ".join(f"{m} = {figures[m][side][-1]:g}" for m in metrics), flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(ref_tree)], cwd=ROOT, check=False,
                       capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    table = Table(title=f"{script} {' '.join(args)}: {opts.rounds} alternating rounds, "
                        f"ref {ref_sha} vs head {head_sha}")
    for column in ("figure", "ref rounds", "head rounds", "ref median", "head median", "head / ref"):
        table.add_column(column)
    ratios = {}
    for metric in metrics:
        ref_median = statistics.median(figures[metric]["ref"])
        head_median = statistics.median(figures[metric]["head"])
        ratios[metric] = head_median / ref_median if ref_median else float("nan")
        table.add_row(metric, ", ".join(f"{v:g}" for v in figures[metric]["ref"]),
                      ", ".join(f"{v:g}" for v in figures[metric]["head"]), f"{ref_median:g}",
                      f"{head_median:g}", f"{ratios[metric]:.2f}")
    Console().print(table)
    out = Path(opts.json or ROOT / "bench" / "results" / f"side_by_side_{Path(script).stem}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"script": script, "args": args, "metric": opts.metric, "ref": ref_sha,
                               "head": head_sha, "figures": figures, "ratios": ratios,
                               "load_average_1m": os.getloadavg()[0]}, indent=1))


if __name__ == "__main__":
    main()
