"""The expected ends a reservation reads, kept by the view from one search to the next and brought
up to date by the runs that came and went and by the clock (`backfill.ExpectedEnds`), are the ends
merged afresh at every time: the same (end, id) list, the same compute aligned, the same earliest
correction."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import test_admission_properties as props

from gpupool.core.model import Allocation, WorkloadInfo
from gpupool.core.scheduling import backfill
from gpupool.core.scheduling.view import ClusterView

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import cycle_latency


def _afresh(view: ClusterView, now: float) -> tuple[list[tuple[float, str]], list[int], float]:
    """The ends merged afresh (each overdue run corrected anew, nothing kept)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backfill, "keep_expected", False)
        mp.setattr(backfill, "keep_corrected", False)
        return backfill._expected_ends(view, now, True)


def _view(seed: int) -> tuple[ClusterView, dict[str, Allocation]]:
    snapshot, _ = cycle_latency.build(20, 0, seed=seed)  # 20 nodes full of work of 600-36,000 s estimates
    view = ClusterView.from_snapshot(snapshot, props.BASE.quota, props.BASE.priority_classes)
    view.materialize()
    return view, {a.workload.id: a for a in snapshot.allocations}


def _come_and_go(view: ClusterView, allocations: dict[str, Allocation], away: list[str],
                 rng: random.Random, now: float, count: int) -> None:
    """`count` runs end and `count` of those away start again, from a time up to 40,000 s back (so
    some are overdue as they come back), a few with checkpointed progress (a nearer planned end)."""
    for _ in range(count):
        if view.running:
            wid = rng.choice(sorted(view.running))
            view.remove(wid)
            away.append(wid)
    for _ in range(count):
        if away:
            wid = away.pop(rng.randrange(len(away)))
            alloc = allocations[wid]
            if rng.random() < 0.3:
                estimate = alloc.workload.runtime_estimate_s or 0.0
                view.info[wid] = WorkloadInfo(progress_s=rng.uniform(0.0, estimate))
            start = max(0.0, now - rng.uniform(0, 40_000))
            assert view.add_allocation(Allocation(alloc.workload, alloc.placements, start))


@pytest.mark.parametrize("seed", range(6))
def test_kept_expected_ends_are_the_ends_merged_afresh(seed: int) -> None:
    """Over 80 steps runs end and start (some overdue as they start) while the clock moves on by a
    little, jumps past many corrections or goes back: after each, the kept ends are those merged
    afresh; they are built again only where the clock went back."""
    view, allocations = _view(seed)
    rng = random.Random(seed)
    search = backfill.KeptSearch.fresh(view.state)
    away: list[str] = []
    now, kept_steps, overdue_seen = 0.0, 0, 0
    for _ in range(80):
        roll = rng.random()
        if roll < 0.1:
            now = max(0.0, now - rng.uniform(0, 3_000))
        else:
            now += rng.uniform(5_000, 60_000) if roll < 0.25 else rng.uniform(0, 900)
        _come_and_go(view, allocations, away, rng, now, rng.randrange(5))
        before = view.expected_ends
        was = before.now_s if before is not None else None
        got = backfill._expected_ends(view, now, True, search)
        assert got == _afresh(view, now)
        late = backfill._overdue(view, now)
        overdue_seen += late > 0
        if before is not None and was is not None and now >= was and late:
            assert view.expected_ends is before  # brought up to date, not built again
            kept_steps += 1
    assert overdue_seen > 20 and kept_steps > 20  # both paths exercised, mostly kept


def test_kept_expected_ends_are_dropped_when_more_came_and_went_than_run() -> None:
    """A log longer than the runs (plus a margin) drops the kept ends; the next search builds them
    afresh, equal to the ends merged afresh."""
    view, allocations = _view(7)
    rng = random.Random(7)
    search = backfill.KeptSearch.fresh(view.state)
    now = 30_000.0
    assert backfill._expected_ends(view, now, True, search) == _afresh(view, now)
    assert view.expected_ends is not None and view.end_log == []
    away: list[str] = []
    _come_and_go(view, allocations, away, rng, now, 40)
    assert view.end_log is not None and len(view.end_log) == 80  # kept: a short log
    for _ in range(20):
        _come_and_go(view, allocations, away, rng, now, 40)
    assert view.expected_ends is None and view.end_log is None
    now += 500.0
    assert backfill._expected_ends(view, now, True, search) == _afresh(view, now)
    assert view.expected_ends is not None
