"""Locality by moving running work: a gang running spread over two leaves is moved into one, and the
single-node work that held the room there moves to the node the gang left."""

from __future__ import annotations

import dataclasses

import pytest
from net_helpers import busy, gang, run, view_on

from gpupool.core.model import Allocation, PodPlacement, Slice, Workload, WorkloadInfo
from gpupool.core.scheduling.cycle import CycleResult
from gpupool.core.scheduling.moves import MoveRule
from gpupool.core.scheduling.view import ClusterView
from gpupool.errors import InvalidInput

CHECKPOINT_S = 1800.0


def _checkpointing(a: Allocation, interval: float | None = CHECKPOINT_S) -> Allocation:
    return dataclasses.replace(a, workload=dataclasses.replace(a.workload, checkpoint_interval_s=interval))


def spread_gang(estimate_s: float, nodes: tuple[str, str] = ("n000", "n002"), wid: str = "g") -> Allocation:
    """A running 2x8-GPU gang with one pod on leaf 0 (n000) and one on leaf 1 (n002)."""
    w = dataclasses.replace(gang(2, 8, wid=wid, estimate_s=estimate_s), checkpoint_interval_s=CHECKPOINT_S)
    slices = tuple(Slice(d, 1000) for d in range(8))
    return Allocation(w, tuple(PodPlacement(f"p{i}", n, slices) for i, n in enumerate(nodes)), 0.0)


def others(single: Allocation) -> list[Allocation]:
    """The gang on n000 + n002, `single` on n001 (leaf 0's other node), every other node busy with
    work that does not checkpoint (it never moves)."""
    rest = [busy(n, 8, f"r{n}", estimate_s=1e6) for n in ("n003", "n004", "n005", "n006", "n007")]
    return [single, *rest]


def nodes_now(view: ClusterView, wid: str) -> list[str]:
    view.materialize()
    return sorted(view.state.nodes[a.node].name for _, a in view.running[wid].allocs)


def standard(estimate_s: float) -> ClusterView:
    """The spread gang (estimated to run `estimate_s`), a checkpointing 8-GPU job on n001."""
    single = _checkpointing(busy("n001", 8, "s", estimate_s=1e6))
    return view_on(running=[spread_gang(estimate_s), *others(single)])


def cycle(
    view: ClusterView, now_s: float, rule: MoveRule | None = None, pending: list[Workload] | None = None,
) -> CycleResult:
    return run(view, pending or [], now_s=now_s, placement="network-aware", moves=rule or MoveRule(),
               backfill=True)


def test_a_spread_gang_moves_into_a_leaf_and_single_node_work_takes_the_node_it_left() -> None:
    view = standard(100_000.0)
    result = cycle(view, now_s=1000.0)
    assert nodes_now(view, "g") == ["n000", "n001"]
    assert nodes_now(view, "s") == ["n002"]
    by_id = {m.workload_id: m for m in result.moved}
    assert set(by_id) == {"g", "s"} and {m.gang_id for m in result.moved} == {"g"}
    assert [p.node for p in by_id["g"].placements] == ["n000", "n001"]
    # 1000 s run, checkpoints every 1800 s: nothing kept, 1000 s done again
    assert by_id["g"].resume_progress_s == 0.0 and by_id["g"].lost_work_s == pytest.approx(1000.0)
    assert view.running["g"].start_time_s == 1000.0
    view.state.check_invariants()
    view.quota.check_invariants()
    # once in one leaf it stays
    later = cycle(view, now_s=5000.0)
    assert later.moved == () and nodes_now(view, "g") == ["n000", "n001"]


def test_progress_kept_by_a_checkpoint_is_resumed() -> None:
    view = standard(100_000.0)
    result = cycle(view, now_s=4000.0)
    g = next(m for m in result.moved if m.workload_id == "g")
    assert g.resume_progress_s == 3600.0 and g.lost_work_s == pytest.approx(400.0)
    assert view.running["g"].progress_s == 3600.0


def test_no_move_when_the_rest_of_the_run_is_worth_less_than_the_move() -> None:
    view = standard(1_200.0)
    assert cycle(view, now_s=1000.0).moved == ()  # 200 s left: less than restarting two workloads
    assert nodes_now(view, "g") == ["n000", "n002"]


@pytest.mark.parametrize("interval", [None, 0.0])
def test_work_that_does_not_checkpoint_is_not_moved(interval: float | None) -> None:
    single = _checkpointing(busy("n001", 8, "s", estimate_s=1e6), interval)
    view = view_on(running=[spread_gang(100_000.0), *others(single)])
    assert cycle(view, now_s=1000.0).moved == ()


def test_a_node_shared_with_another_gang_is_not_made_room_on() -> None:
    view = view_on(running=[
        spread_gang(100_000.0),
        spread_gang(100_000.0, nodes=("n001", "n004"), wid="h"),
        *[busy(n, 8, f"r{n}", estimate_s=1e6) for n in ("n003", "n005", "n006", "n007")],
    ])
    result = cycle(view, now_s=1000.0)
    assert result.moved == ()  # each gang's other leaf is held by the other gang


def test_at_most_max_moved_workloads_move_for_one_gang() -> None:
    halves = [_checkpointing(busy("n001", 4, "s1", estimate_s=1e6))]
    other_half = _checkpointing(busy("n001", 4, "s2", estimate_s=1e6))
    other_half = dataclasses.replace(other_half, placements=(
        PodPlacement("p0", "n001", tuple(Slice(d, 1000) for d in range(4, 8))),))
    running = [spread_gang(100_000.0), *halves, other_half, *others(halves[0])[1:]]
    view = view_on(running=running)
    assert cycle(view, now_s=1000.0, rule=MoveRule(max_moved=1)).moved == ()
    view = view_on(running=running)
    moved = cycle(view, now_s=1000.0, rule=MoveRule(max_moved=2)).moved
    assert {m.workload_id for m in moved} == {"g", "s1", "s2"}
    assert nodes_now(view, "s1") == nodes_now(view, "s2") == ["n002"]


def test_a_gang_not_moved_is_looked_at_again_only_after_retry_s() -> None:
    blocker = _checkpointing(busy("n001", 8, "s", estimate_s=1e6), None)
    view = view_on(running=[spread_gang(100_000.0), *others(blocker)])
    assert cycle(view, now_s=0.0).moved == ()
    view.remove("s")  # leaf 0's other node is free now
    assert cycle(view, now_s=100.0).moved == ()  # looked at 100 s ago
    moved = cycle(view, now_s=600.0).moved
    assert [m.workload_id for m in moved] == ["g"] and nodes_now(view, "g") == ["n000", "n001"]


def test_without_a_move_rule_nothing_moves() -> None:
    view = standard(100_000.0)
    result = run(view, [], now_s=1000.0, placement="network-aware", backfill=True)
    assert result.moved == () and nodes_now(view, "g") == ["n000", "n002"]


def test_moved_work_keeps_the_room_pending_work_would_have_taken() -> None:
    """The moves come before admissions: pending work sees the pool as the moves left it."""
    view = standard(100_000.0)
    result = cycle(view, now_s=1000.0, pending=[gang(1, 8, wid="new", estimate_s=10.0)])
    assert {m.workload_id for m in result.moved} == {"g", "s"}
    assert [r.workload_id for r in result.rejected] == ["new"]  # no room: the moves only swapped nodes


def test_every_move_is_counted_on_the_workload() -> None:
    view = standard(100_000.0)
    cycle(view, now_s=1000.0)
    assert view.info["g"].moves == view.info["s"].moves == 1
    assert view.info["g"].moved_s == view.info["s"].moved_s == 1000.0


@pytest.mark.parametrize(("who", "moves", "moved_s", "moved"), [
    ("s", 1, 0.0, True),  # moved once, two checkpoint intervals ago: it may move again
    ("s", 2, 0.0, False),  # moved max_moves_each (2) times already
    ("s", 1, 9_000.0, False),  # moved 1,000 s ago, within its 1,800 s checkpoint interval
    ("g", 2, 0.0, False),  # the gang's own moves count the same
    ("g", 1, 9_000.0, False),
])
def test_a_workload_moves_at_most_max_moves_each_times_and_once_per_checkpoint_interval(
    who: str, moves: int, moved_s: float, moved: bool,
) -> None:
    view = standard(100_000.0)
    view.info[who] = WorkloadInfo(moves=moves, moved_s=moved_s)
    result = cycle(view, now_s=10_000.0)
    assert {m.workload_id for m in result.moved} == ({"g", "s"} if moved else set())
    if moved:
        assert view.info[who].moves == moves + 1


def test_max_moves_each_one_moves_each_workload_once() -> None:
    view = standard(100_000.0)
    view.info["s"] = WorkloadInfo(moves=1, moved_s=0.0)
    assert cycle(view, now_s=10_000.0, rule=MoveRule(max_moves_each=1)).moved == ()
    assert {m.workload_id for m in cycle(standard(100_000.0), now_s=10_000.0,
                                         rule=MoveRule(max_moves_each=1)).moved} == {"g", "s"}


@pytest.mark.parametrize(("field", "value"), [("restart_s", -1.0), ("retry_s", float("inf")),
                                               ("max_moved", -1), ("min_gain", 0.0),
                                               ("max_moves_each", 0)])
def test_a_bad_move_rule_is_refused(field: str, value: float) -> None:
    with pytest.raises(InvalidInput, match=field):
        MoveRule(**{field: value})  # type: ignore[arg-type]
