"""Plot a replay's device allocation over time to a PNG file (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_replay(result: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """Allocation % against time (hours since the first arrival), in the format the suffix names (PNG
    without one, at `path` itself); returns the written path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result.get("gpu_alloc_pct_timeline", [])
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot([p[0] / 3600.0 for p in points], [p[1] for p in points], linewidth=1)
    ax.set_xlabel("hours since the first arrival")
    ax.set_ylabel("devices allocated (%)")
    ax.set_ylim(0, 105)
    ax.set_title(title or f"mean {result.get('gpu_alloc_pct_mean', 0.0):.1f} % allocated")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100, format=out.suffix.removeprefix(".").lower() or "png")
    plt.close(fig)
    return out
