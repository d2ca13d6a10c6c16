"""Draw a fabric as a PNG: fat-tree levels as rows (roots on top, CAs below), degraded links in red."""

from __future__ import annotations

from pathlib import Path

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


def draw_fabric(fabric: Fabric, out: Path, title: str = "") -> Path:
    """Write a PNG of the fabric. Above MAX_DRAWN_CAS CAs only switches are drawn, with CA counts."""
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
    fig, ax = plt.subplots(figsize=(width, 2.0 + 1.6 * len(rows)))
    degraded = {link.key for link in fabric.degraded_links}
    for link in fabric.links:
        if link.a not in position or link.b not in position or link.a == link.b:
            continue
        (x1, y1), (x2, y2) = position[link.a], position[link.b]
        bad = link.key in degraded or not link.healthy
        ax.plot([x1, x2], [y1, y2], color="red" if bad else "0.6",
                linestyle="--" if bad else "-", linewidth=1.4 if bad else 0.4, zorder=1)
    cas_on = {sw: 0 for sw in fabric.switches}
    for switch, _, _ in fabric.ca_leaf.values():
        cas_on[switch] += 1
    for node, (x, y) in position.items():
        is_switch = fabric.is_switch(node)
        ax.scatter([x], [y], s=60 if is_switch else 12, marker="s" if is_switch else "o",
                   color="tab:blue" if is_switch else "tab:green", zorder=2)
        if is_switch and not with_cas and cas_on[node]:
            ax.annotate(str(cas_on[node]), (x, y), textcoords="offset points", xytext=(0, -12),
                        ha="center", fontsize=6)
    ax.set_yticks([-float(d) for d in range(len(rows))])
    labels = [f"level {len(rows) - 1 - d - (1 if with_cas else 0)}" for d in range(len(rows))]
    if with_cas:
        labels[-1] = "CAs"
    ax.set_yticklabels(labels)
    ax.set_xticks([])
    ax.set_title(title or f"{len(fabric.switches)} switches, {len(fabric.cas)} CAs, "
                 f"{len(fabric.degraded_links)} degraded links (red, dashed)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
