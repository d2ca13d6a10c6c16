"""What the view keeps across cycles for the victim search and the reservation is what computing
it afresh gives: a victim group's runs by id (`VictimGroup.by_id`, from its kept rows) and their
lost work read from its kept columns (`VictimGroup.columns`), the same floats, so the same search
order; the overdue runs' corrected ends (`backfill._corrected_kept`)."""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import test_admission_properties as props
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import cluster
from gpupool.core.model import Workload
from gpupool.core.scheduling import backfill
from gpupool.core.scheduling.cycle import cycle_on
from gpupool.core.scheduling.preemption import VictimIndex, lost_device_s, lost_device_s_columns
from gpupool.core.scheduling.view import ClusterView

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import cycle_latency


def _orders(view: ClusterView, now: float) -> dict[tuple[str, object], list[tuple[float, object, str]]]:
    """Every group's (cost, rank, id) search order, as a cycle's `VictimIndex` makes it."""
    index = VictimIndex(view, now)
    found = {}
    for cq, ranks in view.victim_groups.items():
        for rank in list(ranks):
            found[(cq, rank)] = [entry[:3] for entry in index._group(cq, rank).all()]
    return found


def _check(view: ClusterView, now: float) -> None:
    for ranks in view.victim_groups.values():
        for group in ranks.values():
            runs = group.by_id()
            expected = [group.runs[wid] for wid in sorted(group.runs)]  # the kept rows are the runs by id
            assert len(runs) == len(expected) and all(a is b for a, b in zip(runs, expected, strict=True))
            runs.pop()  # a new list: the group's own is left as it was
            assert len(group.by_id()) == len(expected)
            runs = group.by_id()
            starts, counts, intervals, progress = group.columns
            assert starts == [r.start_time_s for r in runs]
            assert counts == [r.device_count for r in runs]
            assert intervals == [r.workload.checkpoint_interval_s or 0.0 for r in runs]
            assert progress == [r.progress_s for r in runs]
            assert lost_device_s_columns(starts, counts, intervals, progress, now) == [
                lost_device_s(r, now) for r in runs]
    fast = _orders(view, now)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(VictimIndex, "keep_columns", False)
        assert _orders(view, now) == fast


job = st.tuples(props.job, st.sampled_from([None, 7.0, 10.0]), st.integers(0, 3))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), job), min_size=2, max_size=30), st.booleans())
def test_kept_columns_give_the_lost_work_of_the_runs(sequence: list, drf: bool) -> None:
    """Work arrives (with and without checkpoints), runs, ends and is preempted across cycles on one
    kept view; after every cycle each group's columns are its runs' and the search order is the one
    computed from the runs."""
    policies = replace(props.BASE, ordering="drf" if drf else "priority-fifo", preemption=True)
    view = ClusterView.empty(cluster(2, devices=4), policies.quota, policies.priority_classes)
    rng = random.Random(4)
    pending: dict[str, Workload] = {}
    running: dict[str, Workload] = {}
    for step, (finish_one, (spec, interval, reads)) in enumerate(sequence):
        now = float(step * 7)
        if finish_one and view.running:
            view.remove(sorted(view.running)[rng.randrange(len(view.running))])
        w = replace(props._workload(step, spec, now), checkpoint_interval_s=interval)
        pending[w.id] = w
        running.update((wid, r.workload) for wid, r in view.running.items())
        for _ in range(reads):  # groups read (columns made) before the cycle changes them
            _orders(view, now)
        result = cycle_on(view, list(pending.values()), policies, now, rng)
        for stop in result.preempted:
            pending[stop.workload_id] = running[stop.workload_id]
        for admission in result.admitted:
            pending.pop(admission.workload_id)
        for rejection in result.rejected:
            if rejection.final:
                pending.pop(rejection.workload_id)
        _check(view, now + 3.5)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=200_000.0), min_size=2, max_size=12))
def test_kept_corrected_ends_are_the_ends_computed_afresh(times: list[float]) -> None:
    """The overdue runs' corrected ends kept from one reservation to the next (the clock moving on,
    past many of them, or back) are those computed afresh at each time."""
    snapshot, _ = cycle_latency.build(20, 0, seed=2)  # 20 nodes full of work of 600-36,000 s estimates
    view = ClusterView.from_snapshot(snapshot, props.BASE.quota, props.BASE.priority_classes)
    kept_before = 0
    for now in [*sorted(times[: len(times) // 2]), *times[len(times) // 2:], 150_000.0]:
        fast = backfill._expected_ends(view, now, True)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(backfill, "keep_corrected", False)
            assert backfill._expected_ends(view, now, True) == fast
        kept_before = max(kept_before, len(view.corrected_ends))
    assert kept_before  # some run was overdue, its end kept
