"""Pods per node are shared between a state and its copies (`clone_state` copies the list, not the
dicts): every way the core changes them must put a changed copy in the node's slot, never change a
dict in place, or a change to one state would show in every copy of it (a reservation's shadow, the
state a kept reservation compares with, a victim search's base)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.config import load_config
from gpupool.core.model import ClusterSnapshot
from gpupool.core.scheduling import victim_state
from gpupool.core.scheduling.backfill import KeptSearch, _count_runs
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.state import (
    ClusterState,
    allocate_many,
    allocate_placements,
    clone_state,
    free_amounts,
    note_released,
    release_many,
    shift_pod_kinds,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import cycle_latency

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _snapshot() -> ClusterSnapshot:
    return cycle_latency.build(16, 0, 1)[0]


def _view() -> ClusterView:
    """A full pool of the cycle benchmark's shapes (whole devices, fractions, gangs)."""
    policies = load_config(ROOT / "bench/configs/full.yaml").policies()
    view = ClusterView.from_snapshot(_snapshot(), policies.quota, policies.priority_classes)
    view.materialize()
    return view


def _records(view: ClusterView, count: int) -> list:  # type: ignore[type-arg]
    return [record for run in list(view.running.values())[:count] for _, record in run.allocs]


Change = Callable[[], None]


def _one_by_one(view: ClusterView) -> Change:
    def change() -> None:
        for record in _records(view, 5):
            view.state.release(record)
        for record in _records(view, 2):
            view.state.allocate(record)
    return change


def _statement(view: ClusterView) -> Change:
    records = _records(view, 4)
    release_many(view.state, records)

    def change() -> None:
        statement = view.state.statement()
        for record in records[:2]:
            statement.allocate(record)
        statement.commit()
        statement = view.state.statement()
        for record in records[2:]:
            statement.allocate(record)
        statement.discard()
    return change


def _in_bulk(view: ClusterView) -> Change:
    records = _records(view, 40)
    release_many(view.state, records)
    return lambda: allocate_many(view.state, records[:30])


def _released_in_bulk(view: ClusterView) -> Change:
    return lambda: release_many(view.state, _records(view, 40))


def _placements(view: ClusterView) -> Change:
    runs = list(view.running.values())[:40]
    release_many(view.state, [record for run in runs for _, record in run.allocs])
    again = {run.workload.id for run in runs[:30]}
    allocations = [a for a in _snapshot().allocations if a.workload.id in again]
    return lambda: allocate_placements(view.state, allocations)


def _shifted(view: ClusterView) -> Change:
    records = _records(view, 20)

    def change() -> None:
        shift_pod_kinds(view.state, records, -1)
        shift_pod_kinds(view.state, records[:5], 1, strict=True)
    return change


def _noted(view: ClusterView) -> Change:
    return lambda: note_released(view.state, _records(view, 20))


def _kept_sums(view: ClusterView) -> Change:
    search = KeptSearch.fresh(view.state)
    _count_runs(search.sums, list(view.running.values())[:20], 1)
    return lambda: search.note_released(view.state)


def _victims_back(view: ClusterView) -> Change:
    base = free_amounts(view.state)
    runs = list(view.running.values())[:30]
    victim_state.detach_all(view, runs)
    return lambda: victim_state.attach_back(view, runs[5:], base, runs[:5])


CHANGES: dict[str, Callable[[ClusterView], Change]] = {
    "allocate and release": _one_by_one,
    "a statement committed and one discarded": _statement,
    "allocate_many": _in_bulk,
    "release_many": _released_in_bulk,
    "allocate_placements": _placements,
    "shift_pod_kinds": _shifted,
    "note_released": _noted,
    "a kept search's sums released": _kept_sums,
    "victims detached and put back from the base": _victims_back,
}
"""name: a function that brings a full pool where the change applies (the copy is made after it)
and returns the change."""


def _kinds(state: ClusterState) -> list[dict[str, int]]:
    return [dict(kinds) for kinds in state.node_pod_kinds]


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_to_a_state_leaves_its_copies_pods_per_node_alone(change: str) -> None:
    view = _view()
    apply = CHANGES[change](view)
    copy = clone_state(view.state)
    before = _kinds(copy)
    apply()
    assert _kinds(view.state) != before, "the change moved no pod: the test would prove nothing"
    assert _kinds(copy) == before
    assert all(type(kinds) is dict for kinds in view.state.node_pod_kinds)


def test_a_copy_shares_the_dicts_until_a_node_changes() -> None:
    view = _view()
    copy = clone_state(view.state)
    assert all(a is b for a, b in zip(copy.node_pod_kinds, view.state.node_pod_kinds, strict=True))
    record = _records(view, 1)[0]
    view.state.release(record)
    shared = [a is b for a, b in zip(copy.node_pod_kinds, view.state.node_pod_kinds, strict=True)]
    assert shared.count(False) == 1 and not shared[record.node]
