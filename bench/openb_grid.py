"""Benchmark: the OpenB fill grid (17 workloads x policies x seeds) beside the FGD paper's artifact.

For every workload the artifact covers, runs `fill` for each policy and seed in parallel processes,
prints the mean device allocation % at 90/100/130 % arrived demand next to the artifact's mean for
the same policy, and a table of the project's best policy against fgd. With --write-docs it
replaces the text between `<!-- openb-grid:start -->` and `<!-- openb-grid:end -->` in
docs/benchmarks.md (and nothing else).

    python bench/openb_grid.py [--jobs 2] [--seeds 42-51] [--workloads default,cpu050]
        [--policies fgd,best-fit] [--json bench/results/openb_grid.json] [--write-docs]
        [--reuse EARLIER.json --reuse-policies fgd]

--reuse takes the runs of the --reuse-policies from an earlier JSON of this script instead of
running them again (only sound while those policies' code is unchanged; the docs line says so).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from statistics import mean

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpupool.core.scheduling.policies.base import FILL_POLICY, policy_names
from gpupool.errors import GpupoolError
from gpupool.sim.datadir import require_data_dir
from gpupool.sim.fill import FillJob, FillResult, parse_seeds, run_jobs

WORKLOADS = (
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
)
ARTIFACT_NAMES = {
    "random": "01-Random",
    "dot-product": "02-DotProd",
    "gpu-clustering": "03-GpuClustering",
    "gpu-packing": "04-GpuPacking",
    "best-fit": "05-BestFit",
    "fgd": "06-FGD",
}
POINTS = (90, 100, 130)
BEST = FILL_POLICY
START, END = "<!-- openb-grid:start -->", "<!-- openb-grid:end -->"
Means = dict[tuple[str, str], dict[int, float]]


def artifact_means(data: Path, seeds: list[int]) -> Means:
    """(workload, policy) -> {point: mean allocation %} over the given seeds, from the artifact."""
    rows: dict[tuple[str, str], list[list[float]]] = defaultdict(list)
    reverse = {v: k for k, v in ARTIFACT_NAMES.items()}
    with (data / "fgd-artifact" / "analysis_allo_discrete.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            policy = reverse.get(row["sc_policy"])
            if policy and int(row["seed"]) in seeds:
                workload = row["workload"].removeprefix("openb_pod_list_")
                rows[(workload, policy)].append([float(row[str(p)]) for p in POINTS])
    return {
        key: {p: round(mean(v[i] for v in runs), 2) for i, p in enumerate(POINTS)}
        for key, runs in rows.items()
    }


def our_means(results: list[tuple[str, FillResult]]) -> Means:
    grouped: dict[tuple[str, str], list[FillResult]] = defaultdict(list)
    for workload, result in results:
        grouped[(workload, result.policy)].append(result)
    return {key: {p: round(mean(r.at(p) for r in runs), 2) for p in POINTS} for key, runs in grouped.items()}


def markdown(ours: Means, art: Means, workloads: list[str], policies: list[str], meta: str) -> str:
    lines = [meta, "", "Mean device allocation % at 100 % arrived demand (artifact's mean in brackets):", ""]
    lines.append("| workload | " + " | ".join(policies) + " |")
    lines.append("|---" * (len(policies) + 1) + "|")
    for w in workloads:
        cells = []
        for p in policies:
            value = ours.get((w, p), {}).get(100)
            ref = art.get((w, p), {}).get(100)
            cell = "" if value is None else f"{value:.2f}"
            cells.append(cell + (f" ({ref:.2f})" if ref is not None else ""))
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    if BEST in policies and "fgd" in policies:
        lines += ["", f"{BEST} against fgd (ours), at 90 / 100 / 130 % arrived demand:", ""]
        lines.append(
            "| workload | fgd 90 | "
            + BEST
            + " 90 | fgd 100 | "
            + BEST
            + " 100 | fgd 130 | "
            + BEST
            + " 130 | not below fgd |"
        )
        lines.append("|---" * 8 + "|")
        for w in workloads:
            f, b = ours.get((w, "fgd")), ours.get((w, BEST))
            if not f or not b:
                continue
            ok = all(b[p] >= f[p] for p in POINTS)
            lines.append(
                f"| {w} | "
                + " | ".join(f"{f[p]:.2f} | {b[p]:.2f}" for p in POINTS)
                + f" | {'yes' if ok else '**no**'} |"
            )
    return "\n".join(lines)


def write_docs(path: Path, text: str) -> None:
    doc = path.read_text(encoding="utf-8")
    if START not in doc or END not in doc:
        raise SystemExit(f"{path} has no {START} ... {END} markers; add them to the placement section first.")
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(head + START + "\n" + text + "\n" + END + tail, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--policies", default=",".join([*ARTIFACT_NAMES, BEST]))
    parser.add_argument("--json", type=Path, default=Path("bench/results/openb_grid.json"))
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--reuse", type=Path, help="Earlier JSON of this script to take runs from.")
    parser.add_argument("--reuse-policies", default="", help="Policies whose runs --reuse supplies.")
    args = parser.parse_args()
    console = Console()
    try:
        data = require_data_dir()
        seeds = parse_seeds(args.seeds)
    except GpupoolError as exc:
        console.print(f"Error: {exc.message}")
        return 2
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in policy_names()] + [w for w in workloads if w not in WORKLOADS]
    if unknown:
        console.print(f"Error: unknown policy or workload {unknown}; see --help.")
        return 2
    nodes = str(data / "openb" / "openb_node_list_gpu_node.csv")
    work = [
        (w, FillJob(nodes, str(data / "openb" / f"openb_pod_list_{w}.csv"), p, s))
        for w in workloads
        for p in policies
        for s in seeds
    ]
    reused: dict[int, FillResult] = {}
    reuse_policies = {p.strip() for p in args.reuse_policies.split(",") if p.strip()}
    if args.reuse and reuse_policies:
        try:
            earlier_runs = json.loads(args.reuse.read_text(encoding="utf-8"))["runs"]
        except (OSError, ValueError, KeyError, TypeError):
            console.print(f"Error: cannot read runs from {args.reuse}; pass a JSON this script wrote.")
            return 2
        earlier = {
            (r["workload"], r["policy"], r["seed"]): r for r in earlier_runs if r["policy"] in reuse_policies
        }
        for i, (w, job) in enumerate(work):
            r = earlier.get((w, job.policy, job.seed))
            if r is not None:
                reused[i] = FillResult(job.policy, job.seed, tuple(r["alloc_pct"]), r["wall_s"], 0, 0, 0)
    todo = [i for i in range(len(work)) if i not in reused]
    started = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("fill runs", total=len(todo))
        fresh = run_jobs([work[i][1] for i in todo], args.jobs, on_done=lambda _r: progress.advance(task))
    wall = time.perf_counter() - started
    done = dict(zip(todo, fresh, strict=True))
    results = [done[i] if i in done else reused[i] for i in range(len(work))]
    paired = [(w, r) for (w, _), r in zip(work, results, strict=True)]
    ours, art = our_means(paired), artifact_means(data, seeds)
    table = Table(title=f"OpenB fill: mean allocation % at 100 % arrived (artifact), seeds {args.seeds}")
    table.add_column("workload")
    for p in policies:
        table.add_column(p, justify="right")
    for w in workloads:
        table.add_row(
            w,
            *(
                f"{ours[(w, p)][100]:.2f}" + (f" ({art[(w, p)][100]:.2f})" if (w, p) in art else "")
                for p in policies
            ),
        )
    console.print(table)
    reused_names = ",".join(sorted(reuse_policies))
    meta = (
        f"Command: `.venv/bin/python bench/openb_grid.py --jobs {args.jobs} --seeds {args.seeds}"
        f" --policies {','.join(policies)}"
        + (f" --workloads {','.join(workloads)}" if workloads != list(WORKLOADS) else "")
        + (f" --reuse {args.reuse.as_posix()} --reuse-policies {reused_names}" if reused else "")
        + " --write-docs`"
        f" ({len(todo)} runs, {wall:.0f} s wall on this machine"
        + (f"; {len(reused)} runs of {reused_names} taken from the earlier JSON" if reused else "")
        + f"; measured {time.strftime('%Y-%m-%d', time.gmtime())})."
    )
    text = markdown(ours, art, workloads, policies, meta)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "seeds": seeds,
                "wall_s": round(wall, 1),
                "ours": {f"{w}/{p}": v for (w, p), v in ours.items()},
                "artifact": {f"{w}/{p}": v for (w, p), v in art.items()},
                "runs": [
                    {
                        "workload": w,
                        "policy": r.policy,
                        "seed": r.seed,
                        "alloc_pct": list(r.alloc_pct),
                        "wall_s": round(r.wall_s, 3),
                    }
                    for w, r in paired
                ],
            },
            indent=1,
        )
        + "\n"
    )
    console.print(f"JSON written to {args.json}")
    if args.write_docs:
        write_docs(Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md", text)
        console.print("docs/benchmarks.md updated between the openb-grid markers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
