"""Moving off congestion: which gangs have had their bottleneck link loaded above the threshold for
long enough to be checkpoint-requeued and placed again elsewhere.

Judged by the cycle, for the live server (samples from its telemetry route:
`server/services/fabric_links.hand_congestion`) and the replay (`sim/replay.py`, samples from the
communication model's truth) alike, so both move the same gangs for the same history of samples.
A gang's clock starts at the first sample that sees it hot; a sample that does not see it hot
forgets it (the load must stay above the threshold without a break); a gang that is due is dropped
from the clock (it is requeued, and starts afresh where it lands).

The cycle judges each sample (`MigrateRule.judge`) and stops the gangs due with kind migrate
(`cycle.EventKind.MIGRATE`); the server and the replay only hand it the samples.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from gpupool.errors import InvalidInput


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


@dataclass(frozen=True, slots=True)
class CongestionSample:
    """One telemetry sample, as the caller hands it to the view (`ClusterView.congestion_sample`)
    for the next cycle to judge: gang -> the load of its bottleneck link (fraction of its data
    rate), for the gangs that moving could relieve."""

    at_s: float
    loads: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class MigrateRule:
    """Move gangs off congested links (the configuration's fabric.migrate_on_congestion,
    congestion_threshold, congestion_for; `Policies.migrate`): a gang whose bottleneck stays above
    `threshold` for `hold_s` is stopped (kind migrate) and requeued by the cycle, at most
    `max_moves_each` times: where every placement it can get crosses a congested link, a gang moved
    at every sample would never finish."""

    threshold: float = 0.9
    hold_s: float = 300.0
    max_moves_each: int = 2

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 2 or not math.isfinite(self.threshold):
            raise InvalidInput(f"The congestion threshold must be a utilisation in (0, 2], got "
                               f"{self.threshold}.")
        if self.max_moves_each < 1:
            raise InvalidInput(f"A gang's congestion moves must be bounded by at least 1 (leave "
                               f"migrate_on_congestion off to move nothing), got {self.max_moves_each}.")
        if not 0 <= self.hold_s < math.inf:
            raise InvalidInput(f"The congestion hold time must be a finite number of seconds >= 0, got "
                               f"{self.hold_s}.")

    def judge(self, sample: CongestionSample, running: Collection[str], since: dict[str, float]) -> list[str]:
        """The running gangs due to move at this sample, sorted; `since` (the clock) is updated."""
        hot = [w for w, load in sample.loads.items() if load > self.threshold and w in running]
        due, kept = due_to_move(hot, since, sample.at_s, self.hold_s)
        since.clear()
        since.update(kept)
        return due

    def why(self) -> str:
        return f"Moved: its bottleneck stayed above {self.threshold:.0%} load for {self.hold_s:g} s."
