"""Summaries, JSON and PNG plots of fill runs (allocation % against arrived demand)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from statistics import mean
from typing import Any

from gpupool.sim.fill import MAX_PERCENT, FillResult

REPORT_POINTS = (90, 100, 130)


def policies_in_order(results: Iterable[FillResult]) -> list[str]:
    """Policy names in the order they first appear."""
    return list(dict.fromkeys(r.policy for r in results))


def mean_curve(results: Sequence[FillResult], policy: str) -> list[float]:
    """The allocation curve of one policy averaged over its seeds."""
    runs = [r.alloc_pct for r in results if r.policy == policy]
    return [round(mean(run[i] for run in runs), 2) for i in range(MAX_PERCENT + 1)]


def summary(
    results: Sequence[FillResult], points: Sequence[int] = REPORT_POINTS
) -> dict[str, dict[str, float]]:
    """{policy: {"90": mean %, "100": mean %, "130": mean %}} over the seeds of each policy."""
    out: dict[str, dict[str, float]] = {}
    for policy in policies_in_order(results):
        curve = mean_curve(results, policy)
        out[policy] = {str(p): curve[p] for p in points}
    return out


def to_json(results: Sequence[FillResult]) -> dict[str, Any]:
    """The document `gpupool sim fill --json` writes."""
    return {
        "summary": summary(results),
        "runs": [
            {"policy": r.policy, "seed": r.seed, "alloc_pct": list(r.alloc_pct), "wall_s": round(r.wall_s, 3)}
            for r in results
        ],
    }


def write_json(results: Sequence[FillResult], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(results), indent=1) + "\n", encoding="utf-8")


def plot(results: Sequence[FillResult], path: Path, title: str = "") -> None:
    """Mean allocation % against arrived demand %, one curve per policy, at `path` in the format its
    suffix names (PNG without one: the file is `path` itself, never `path` with .png added)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.5), dpi=120)
    xs = list(range(MAX_PERCENT + 1))
    for policy in policies_in_order(results):
        seeds = sum(1 for r in results if r.policy == policy)
        ax.plot(xs, mean_curve(results, policy), label=f"{policy} ({seeds} seeds)", linewidth=1.4)
    ax.plot(xs, [min(x, 100) for x in xs], color="grey", linestyle=":", linewidth=0.8, label="ideal")
    ax.set_xlabel("arrived demand (% of device capacity)")
    ax.set_ylabel("device allocation (%)")
    ax.set_xlim(0, MAX_PERCENT)
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    inset = ax.inset_axes((0.08, 0.55, 0.38, 0.38))
    for policy in policies_in_order(results):
        inset.plot(xs[85:], mean_curve(results, policy)[85:], linewidth=1.2)
    inset.set_title("85-130 %", fontsize=7)
    inset.tick_params(labelsize=6)
    inset.grid(True, alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=path.suffix.removeprefix(".").lower() or "png")
    plt.close(fig)
