"""Run a control-plane benchmark on two sides alternately in one run: commits, configurations or arguments.

The machine is shared and noisy, so a figure means something only beside its anchor measured under
the same load. With --ref, this checks out REF in a temporary git worktree, then runs the benchmark
script (with its own arguments) ROUNDS times for each side, alternating (ref, head, ref, head, ...),
each with the `gpupool` package of its side first on PYTHONPATH. With --config-a/--config-b it runs
this checkout on both sides, the benchmark given `--config FILE` (none: the pool's defaults), a then
b, round after round; with --args-a/--args-b, this checkout on both sides, each adding its own
arguments to the benchmark's (split as a shell would). It prints the per-round figures and the
ratio of the medians (head / ref, or b / a), and writes JSON under bench/results/ (with every round's
whole result).

  .venv/bin/python bench/side_by_side.py --ref HEAD~5 --rounds 3 -- bench/jobs_e2e.py --jobs 1000
  .venv/bin/python bench/side_by_side.py --ref HEAD~5 --metric submissions_per_s -- \\
      bench/api_load.py --total 2000 --backends sqlite
  .venv/bin/python bench/side_by_side.py --config-b bench/configs/live-full-1x8.yaml --rounds 7 \\
      --metric jobs_per_s -- bench/jobs_e2e.py --jobs 1000 --mix cohort
  .venv/bin/python bench/side_by_side.py --args-a "--netns off" --args-b "--netns on" --rounds 5 \\
      --metric jobs_per_s,submit_to_running_p50_ms -- bench/jobs_e2e.py --jobs 1000
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Side:
    name: str
    """ref/head, or a/b"""
    src: Path
    """the `gpupool` package's parent directory this side imports"""
    args: tuple[str, ...] = ()
    """what this side adds to the benchmark's arguments"""


def _run(script: str, args: list[str], src: Path, out: Path) -> dict[str, object] | None:
    """The benchmark's JSON, or None when it failed (its error is on stderr)."""
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, str(ROOT / script), *args, "--json", str(out)], env=env,
                          check=False, cwd=ROOT, stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        return None
    data = json.loads(out.read_text())
    return dict(data)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _figure(result: dict[str, object], metric: str) -> float:
    """`metric` from a benchmark's JSON (top level, or the first row of a `results`/`rows`/`fabrics` list)."""
    if metric in result:
        return float(result[metric])  # type: ignore[arg-type]
    for key in ("results", "rows", "backends", "fabrics"):
        rows = result.get(key)
        if isinstance(rows, list) and rows and isinstance(rows[0], dict) and metric in rows[0]:
            return float(rows[0][metric])
        if isinstance(rows, dict):
            for row in rows.values():
                if isinstance(row, dict) and metric in row:
                    return float(row[metric])
    raise SystemExit(f"the benchmark's JSON has no {metric!r}; pick one with --metric "
                     f"(keys: {sorted(result)})")


def _sides(opts: argparse.Namespace, work: Path) -> tuple[list[Side], str]:
    """The two sides to alternate and a title naming them; the ref's worktree is made under `work`."""
    if opts.ref:
        ref_tree = work / "ref"
        subprocess.run(["git", "worktree", "add", "--detach", str(ref_tree), opts.ref], cwd=ROOT,
                       check=True, capture_output=True)
        ref_sha = _short(opts.ref)
        return [Side("ref", ref_tree / "src"), Side("head", ROOT / "src")], \
            f"ref {ref_sha} vs head {_short('HEAD')}"
    if opts.args_a or opts.args_b:
        sides = [Side(name, ROOT / "src", tuple(shlex.split(extra)))
                 for name, extra in (("a", opts.args_a), ("b", opts.args_b))]
        return sides, f"a = {opts.args_a or 'no arguments'!r} vs b = {opts.args_b or 'no arguments'!r} " \
            f"at {_short('HEAD')}"
    sides = [Side(name, ROOT / "src", ("--config", path) if path else ())
             for name, path in (("a", opts.config_a), ("b", opts.config_b))]
    names = f"a = {opts.config_a or 'defaults'} vs b = {opts.config_b or 'defaults'}"
    return sides, f"{names} at {_short('HEAD')}"


def _short(ref: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="", help="the earlier commit to compare with")
    parser.add_argument("--config-a", default="",
                        help="side a's pool configuration (default: none, the pool's defaults)")
    parser.add_argument("--config-b", default="", help="side b's pool configuration")
    parser.add_argument("--args-a", default="", help="arguments side a adds to the benchmark's")
    parser.add_argument("--args-b", default="", help="arguments side b adds to the benchmark's")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--metric", default="jobs_per_s",
                        help="the JSON figure(s) to compare, comma-separated (the first is the headline)")
    parser.add_argument("--json", default="")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    opts = parser.parse_args()
    bench = [a for a in opts.bench if a != "--"]
    if not bench:
        raise SystemExit("give the benchmark after --, e.g. -- bench/jobs_e2e.py --jobs 1000")
    modes = [bool(opts.ref), bool(opts.config_a or opts.config_b), bool(opts.args_a or opts.args_b)]
    if sum(modes) != 1:
        raise SystemExit("compare with an earlier commit (--ref COMMIT), two configurations (--config-a "
                         "FILE and/or --config-b FILE) or two sets of arguments (--args-a and/or --args-b), "
                         "one of the three")
    for path in (opts.config_a, opts.config_b):
        if path and not Path(path).is_file():
            raise SystemExit(f"no configuration file {path!r}; check the path given to --config-a/--config-b")
    script, args = bench[0], bench[1:]
    work = Path(tempfile.mkdtemp(prefix="gpupool-side-"))
    metrics = [m.strip() for m in opts.metric.split(",") if m.strip()]
    try:
        sides, compared = _sides(opts, work)
        figures: dict[str, dict[str, list[float]]] = {m: {s.name: [] for s in sides} for m in metrics}
        results: dict[str, list[dict[str, object]]] = {s.name: [] for s in sides}
        failed: dict[str, list[int]] = {s.name: [] for s in sides}
        for round_no in range(opts.rounds):
            for side in sides:
                result = _run(script, [*args, *side.args], side.src, work / f"{side.name}-{round_no}.json")
                if result is None:  # counted and shown, left out of the medians
                    failed[side.name].append(round_no + 1)
                    print(f"round {round_no + 1} {side.name}: failed", flush=True)
                    continue
                results[side.name].append(result)
                for metric in metrics:
                    figures[metric][side.name].append(_figure(result, metric))
                print(f"round {round_no + 1} {side.name}: "
                      + ", ".join(f"{m} = {figures[m][side.name][-1]:g}" for m in metrics), flush=True)
    finally:
        if opts.ref:
            subprocess.run(["git", "worktree", "remove", "--force", str(work / "ref")], cwd=ROOT,
                           check=False, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    first, second = sides[0].name, sides[1].name
    table = Table(title=f"{script} {' '.join(args)}: {opts.rounds} alternating rounds, {compared}")
    for column in ("figure", f"{first} rounds", f"{second} rounds", f"{first} median",
                   f"{second} median", f"{second} / {first}"):
        table.add_column(column)
    ratios = {}
    for metric in metrics:
        first_median = _median(figures[metric][first])
        second_median = _median(figures[metric][second])
        ratios[metric] = second_median / first_median if first_median else float("nan")
        table.add_row(metric, ", ".join(f"{v:g}" for v in figures[metric][first]),
                      ", ".join(f"{v:g}" for v in figures[metric][second]), f"{first_median:g}",
                      f"{second_median:g}", f"{ratios[metric]:.2f}")
    Console().print(table)
    for name, rounds in failed.items():
        if rounds:
            print(f"side {name} failed in rounds {', '.join(map(str, rounds))} (left out above)")
    suffix = "" if opts.ref else "_args" if modes[2] else "_configs"
    default_name = f"side_by_side_{Path(script).stem}{suffix}"
    out = Path(opts.json or ROOT / "bench" / "results" / f"{default_name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"script": script, "args": args, "metric": opts.metric, "compared": compared,
                               "sides": {s.name: list(s.args) or str(s.src) for s in sides},
                               "figures": figures, "ratios": ratios, "results": results,
                               "failed_rounds": failed,
                               "load_average_1m": os.getloadavg()[0]}, indent=1))


if __name__ == "__main__":
    main()
