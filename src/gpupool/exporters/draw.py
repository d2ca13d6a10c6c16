"""Draw a fabric as a PNG or SVG: levels as rows (roots on top, hosts below), names, a legend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.core.fabric.model import Fabric

MAX_DRAWN_CAS = 400


def _rows(fabric: Fabric, with_cas: bool) -> list[list[str]]:
    levels = fabric.levels
    top = max(levels.values(), default=0)
    rows: list[list[str]] = [[] for _ in range(top + 1)]
    for switch in fabric.switches:
        rows[top - levels[switch] if switch in levels else top].append(switch)
    unplaced = [s for s in fabric.switches if s not in levels]
    if unplaced:
        rows.append(unplaced)
    if with_cas:
        rows.append(sorted(fabric.cas, key=lambda ca: (fabric.ca_leaf.get(ca, ("~",))[0], ca)))
    return rows


MAX_NAMED_HOSTS = 64
"""Above this many CAs, hosts are not named one by one: each leaf shows how many it holds."""
MAX_NAMED_SWITCHES = 120


def labels(fabric: Fabric) -> dict[str, str]:
    """The text drawn beside each node: switch names, host names (or `N hosts` under each leaf)."""
    from gpupool.exporters.slurm import host_of

    text: dict[str, str] = {}
    if len(fabric.switches) <= MAX_NAMED_SWITCHES:
        text.update({sw: fabric.nodes[sw].label for sw in fabric.switches})
    if len(fabric.cas) <= MAX_NAMED_HOSTS:
        text.update({ca: host_of(fabric, ca) for ca in fabric.cas})
        return text
    below = {sw: 0 for sw in fabric.switches}
    for switch, _, _ in fabric.ca_leaf.values():
        below[switch] += 1
    for switch, count in below.items():
        if count:
            name = text.get(switch, "")
            text[switch] = f"{name}\n{count} hosts" if name else f"{count} hosts"
    return text


def draw_fabric(fabric: Fabric, out: Path, title: str = "") -> Path:
    """Write a picture of the fabric with names and a legend at `out`, in the format its suffix names
    (PNG without one: the file is `out` itself, never `out` with .png added).

    Above MAX_DRAWN_CAS CAs only switches are drawn; above MAX_NAMED_HOSTS each leaf carries its
    host count instead of one name per host.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_cas = len(fabric.cas) <= MAX_DRAWN_CAS
    rows = _rows(fabric, with_cas)
    position: dict[str, tuple[float, float]] = {}
    for depth, row in enumerate(rows):
        for i, node in enumerate(row):
            position[node] = ((i + 0.5) / max(len(row), 1), -float(depth))
    width = min(40.0, 6.0 + 0.08 * max(len(row) for row in rows))
    with plt.rc_context({"svg.fonttype": "none"}):  # names stay text in an SVG (searchable)
        fig, ax = plt.subplots(figsize=(width, 2.4 + 1.6 * len(rows)))
        _draw_links(ax, fabric, position)
        _draw_nodes(ax, fabric, position, labels(fabric), crowded=max(len(row) for row in rows) > 24)
        ax.set_yticks([-float(d) for d in range(len(rows))])
        names = [f"level {len(rows) - 1 - d - (1 if with_cas else 0)}" for d in range(len(rows))]
        if with_cas:
            names[-1] = "hosts (CAs)"
        ax.set_yticklabels(names)
        ax.set_xticks([])
        ax.set_title(title or f"{len(fabric.switches)} switches, {len(fabric.cas)} CAs")
        _legend(ax, with_cas, bool(fabric.degraded_links))
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110, format=out.suffix.removeprefix(".").lower() or "png")
        plt.close(fig)
    return out


def _draw_links(ax: Any, fabric: Fabric, position: dict[str, tuple[float, float]]) -> None:
    degraded = {link.key for link in fabric.degraded_links}
    for link in fabric.links:
        if link.a not in position or link.b not in position or link.a == link.b:
            continue
        (x1, y1), (x2, y2) = position[link.a], position[link.b]
        bad = link.key in degraded or not link.healthy
        ax.plot([x1, x2], [y1, y2], color="red" if bad else "0.6",
                linestyle="--" if bad else "-", linewidth=1.4 if bad else 0.4, zorder=1)


def _draw_nodes(ax: Any, fabric: Fabric, position: dict[str, tuple[float, float]], text: dict[str, str],
                crowded: bool) -> None:
    for node, (x, y) in position.items():
        is_switch = fabric.is_switch(node)
        ax.scatter([x], [y], s=60 if is_switch else 12, marker="s" if is_switch else "o",
                   color="tab:blue" if is_switch else "tab:green", zorder=2)
        if node in text:
            ax.annotate(text[node], (x, y), textcoords="offset points", xytext=(0, -10 if is_switch else -6),
                        ha="center", va="top", fontsize=5 if crowded else 7, zorder=3,
                        rotation=90 if crowded and not is_switch else 0,
                        bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})


def _legend(ax: Any, with_cas: bool, degraded: bool) -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="s", linestyle="", color="tab:blue", label="switch")]
    if with_cas:
        handles.append(Line2D([], [], marker="o", linestyle="", color="tab:green", label="host (CA)"))
    handles.append(Line2D([], [], color="0.6", linewidth=0.8, label="link"))
    if degraded:
        handles.append(Line2D([], [], color="red", linestyle="--", label="degraded link (below the norm)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.03), ncol=len(handles),
              fontsize=7, frameon=False)
