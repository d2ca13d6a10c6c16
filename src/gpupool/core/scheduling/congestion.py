"""Moving off congestion: which gangs have had their bottleneck link loaded above the threshold for
long enough to be checkpoint-requeued and placed again elsewhere.

Shared by the live server (`server/services/fabric_links.due_to_move`, fed by telemetry) and the
replay (`sim/replay.py`, fed by the communication model's truth), so both move the same gangs for
the same history of samples. A gang's clock starts at the first sample that sees it hot; a sample
that does not see it hot forgets it (the load must stay above the threshold without a break); a
gang that is due is dropped from the clock (it is requeued, and starts afresh where it lands).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def due_to_move(hot: Iterable[str], since: Mapping[str, float], now_s: float,
                hold_s: float) -> tuple[list[str], dict[str, float]]:
    """(gangs due to move, sorted; the first-seen-hot times to keep for the next sample).

    `hot`: the gangs whose bottleneck is above the threshold at this sample; `since`: the map this
    function returned at the previous sample (empty at first); a gang is due once it has been hot
    since at least `hold_s` ago (at once when `hold_s` is 0)."""
    seen = {w: since.get(w, now_s) for w in hot}
    due = sorted(w for w, t in seen.items() if now_s - t >= hold_s)
    moved = set(due)
    return due, {w: t for w, t in seen.items() if w not in moved}
