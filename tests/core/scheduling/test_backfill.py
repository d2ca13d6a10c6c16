"""EASY backfill: the head keeps its reserved start; estimates come from the user or history."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from factories import cluster, pod, workload
from gpupool.core.model import Reason, Workload
from gpupool.core.scheduling import backfill, cycle
from gpupool.core.scheduling.backfill import RuntimeEstimator, corrected_end_s, may_backfill, reserve
from gpupool.core.scheduling.cycle import Policies, cycle_on
from gpupool.core.scheduling.policies.base import make_policy
from gpupool.core.scheduling.view import ClusterView, Running

EASY = Policies(placement="first-fit", ordering="fifo", backfill=True)


def _w(gpus: float, wid: str, submit: float, runtime: float | None) -> Workload:
    return replace(workload(pod(gpus), wid=wid, submit_s=submit), runtime_estimate_s=runtime)


def _busy_view() -> ClusterView:
    """5 devices: 2 busy until t=1000, 1 until t=100, 2 free."""
    view = ClusterView.empty(cluster(1, devices=5))
    first = cycle_on(
        view, [_w(2, "long", 0, 1000.0), _w(1, "short", 0.5, 100.0)], EASY, 0.0, random.Random(0)
    )
    assert len(first.admitted) == 2
    return view


def test_head_gets_a_reservation_at_the_earliest_estimated_end() -> None:
    view = _busy_view()
    result = cycle_on(view, [_w(3, "head", 1, 50.0)], EASY, 10.0, random.Random(0))
    assert result.reservation is not None
    assert (result.reservation.workload_id, result.reservation.start_s) == ("head", 100.0)


def test_short_job_backfills_and_long_job_waits() -> None:
    view = _busy_view()
    pending = [_w(3, "head", 1, 50.0), _w(1, "fits-before", 2, 80.0), _w(1, "too-long", 3, 500.0)]
    result = cycle_on(view, pending, EASY, 10.0, random.Random(0))
    assert [a.workload_id for a in result.admitted] == ["fits-before"]
    blocked = {r.workload_id: r.reason for r in result.rejected}
    assert blocked["too-long"] == Reason.BACKFILL_BLOCKED


def test_without_backfill_strict_fifo_blocks_behind_the_head() -> None:
    view = _busy_view()
    pending = [_w(3, "head", 1, 50.0), _w(1, "small", 2, 10.0)]
    result = cycle_on(view, pending, replace(EASY, backfill=False), 10.0, random.Random(0))
    assert not result.admitted
    assert {r.workload_id: r.reason for r in result.rejected}["small"] == Reason.WAITING_FOR_HEAD


def test_backfill_does_not_move_the_reservation() -> None:
    view = _busy_view()
    head = _w(3, "head", 1, 50.0)
    pending = [head, _w(1, "b1", 2, 80.0), _w(1, "b2", 3, 5000.0)]
    result = cycle_on(view, pending, EASY, 10.0, random.Random(0))
    assert result.reservation is not None
    again = reserve(head, view, 10.0, make_policy("first-fit"), random.Random(0))
    assert again is not None and again.start_s <= result.reservation.start_s


def _overdue_view() -> ClusterView:
    """8 devices: two runs of 3 estimated at 100 s and 120 s (both past at t=150), 2 free."""
    view = ClusterView.empty(cluster(1, devices=8))
    first = cycle_on(view, [_w(3, "a1", 0, 100.0), _w(3, "a2", 0.5, 120.0)], EASY, 0.0, random.Random(0))
    assert len(first.admitted) == 2
    return view


def test_overdue_runs_are_expected_at_their_estimate_doubled_not_now() -> None:
    """Past its estimate a run is not free: the head (5 devices) is reserved for when the first
    overdue run should end by its doubled estimate (200), and a long job that would take the two
    free devices it needs then waits. Counting both overdue runs as ending now (the reckoning
    before) finds room for both at once, so the long job started and the head waited for it."""
    view = _overdue_view()
    head, long = _w(5, "head", 1, 50.0), _w(2, "long", 2, 5000.0)
    old = reserve(head, view, 150.0, make_policy("first-fit"), random.Random(0), correct=False)
    assert old is not None and old.start_s == 150.0
    result = cycle_on(view, [head, long], EASY, 150.0, random.Random(0))
    assert result.reservation is not None
    assert (result.reservation.workload_id, result.reservation.start_s) == ("head", 200.0)
    assert not result.admitted
    assert {r.workload_id: r.reason for r in result.rejected}["long"] == Reason.BACKFILL_BLOCKED


def test_a_short_job_still_backfills_before_the_corrected_end() -> None:
    view = _overdue_view()
    result = cycle_on(view, [_w(5, "head", 1, 50.0), _w(2, "short", 2, 40.0)], EASY, 150.0, random.Random(0))
    assert [a.workload_id for a in result.admitted] == ["short"]


def _two_nodes() -> ClusterView:
    """Two nodes of 4 devices: A holds a run of 2 until t=100, B one of 3 until t=1000."""
    view = ClusterView.empty(cluster(2, devices=4))
    first = cycle_on(view, [_w(2, "r1", 0, 100.0), _w(3, "r2", 0.5, 1000.0)], EASY, 0.0, random.Random(0))
    assert [a.workload_id for a in first.admitted] == ["r1", "r2"]
    return view


def test_work_refused_for_the_head_is_refused_by_key_but_not_when_it_ends_first() -> None:
    """The head (4 devices) is reserved on A at 100. k1 (1 device, long) lands on A and is refused;
    k2, of the same shape and queue, is refused without being placed again; k3, the same shape but
    done by 100, starts."""
    pending = [_w(4, "head", 1, 50.0), _w(1, "k1", 2, 5000.0), _w(1, "k2", 3, 5000.0), _w(1, "k3", 4, 10.0)]
    checked: list[str] = []

    def counting(gang, *args):  # type: ignore[no-untyped-def]
        checked.append(gang.workload.id)
        return may_backfill(gang, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle, "may_backfill", counting)
        mp.setattr(cycle, "beside_reserved", False)  # else k1 starts on B, beside the head's node
        result = cycle_on(_two_nodes(), pending, EASY, 0.0, random.Random(0))
    assert checked == ["k1", "k3"]
    assert result.reservation is not None and result.reservation.start_s == 100.0
    assert [a.workload_id for a in result.admitted] == ["k3"]
    reasons = {r.workload_id: r.reason for r in result.rejected}
    assert reasons["k1"] == reasons["k2"] == Reason.BACKFILL_BLOCKED


def test_an_admission_lifts_the_refusal_of_a_key() -> None:
    """k1 (1 device, long) lands on A, which the head needs: refused. x (2 devices, done by 100)
    then fills A, so k2, of k1's shape and queue, lands on B, off the head's node: it starts."""
    pending = [_w(4, "head", 1, 50.0), _w(1, "k1", 2, 5000.0), _w(2, "x", 3, 50.0), _w(1, "k2", 4, 5000.0)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle, "beside_reserved", False)  # else k1 starts on B, beside the head's node
        result = cycle_on(_two_nodes(), pending, EASY, 0.0, random.Random(0))
    assert [a.workload_id for a in result.admitted] == ["x", "k2"]
    assert {r.workload_id: r.reason for r in result.rejected}["k1"] == Reason.BACKFILL_BLOCKED


def _running(start: float, estimate: float | None, progress: float = 0.0) -> Running:
    return Running(workload(wid="r"), (), start, "", {}, (0, 0), estimate_s=estimate, progress_s=progress)


def test_corrected_end_doubles_the_estimate_until_it_lies_ahead() -> None:
    assert corrected_end_s(_running(0.0, 100.0), 50.0) == 100.0  # not overdue: the planned end
    assert corrected_end_s(_running(0.0, 100.0), 100.0) == 200.0  # due now: never "now"
    assert corrected_end_s(_running(0.0, 100.0), 450.0) == 800.0
    assert corrected_end_s(_running(10.0, 100.0, progress=60.0), 60.0) == 10.0 + 200.0 - 60.0  # resumed
    assert corrected_end_s(_running(0.0, 0.0), 5.0) == 8.0  # a zero estimate doubles from one second
    assert corrected_end_s(_running(0.0, None), 5.0) == float("inf")  # no estimate: never ends


def test_estimator_prefers_user_then_name_then_shape_and_measures_error() -> None:
    est = RuntimeEstimator()
    w = replace(workload(wid="a", tenant="t"), name="train")
    assert est.estimate_s(w) is None
    est.observe(w, 100.0, None)
    est.observe(w, 300.0, 100.0)
    assert est.estimate_s(replace(w, id="b")) == 200.0
    est.observe(replace(w, name="eval"), 20.0, None)
    assert est.estimate_s(replace(w, id="b")) == 200.0  # its own name's runs first
    other = replace(workload(wid="c", tenant="t"), name="other")
    assert est.estimate_s(other) == (100.0 + 300.0 + 20.0) / 3  # the same tenant, queue and shape
    assert est.estimate_s(replace(other, runtime_estimate_s=7.0)) == 7.0
    assert est.history_error.summary()["mean_abs_error_s"] == 200.0
    assert est.history_error.summary()["underestimated_pct"] == 100.0


def test_history_of_other_queues_shapes_or_tenants_estimates_nothing() -> None:
    """Short jobs of the tenant's other queue, of another shape, or of another tenant say nothing
    of a long run: it gets no estimate (it never ends in the reservation's reckoning), where the
    older reckoning gave it their mean."""
    est = RuntimeEstimator()
    for short in (replace(workload(pod(1), tenant="t"), queue="dev"),
                  workload(pod(0.3), tenant="t"), workload(pod(1), tenant="u")):
        est.observe(short, 8.0, None)
    long = workload(pod(1), tenant="t")
    assert est.estimate_s(long) is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backfill, "history_by", "tenant")
        assert est.estimate_s(long) == 8.0


FULL = replace(EASY, preemption=True)


def _classed(gpus: float, wid: str, submit: float, runtime: float | None, klass: str) -> Workload:
    return replace(_w(gpus, wid, submit, runtime), priority_class=klass)


def _best_effort_full() -> ClusterView:
    """One node of 4 devices, each held by a best-effort run estimated to end at t=1000."""
    view = ClusterView.empty(cluster(1, devices=4))
    runs = [_classed(1, f"be{i}", i, 1000.0, "best-effort") for i in range(4)]
    assert len(cycle_on(view, runs, FULL, 0.0, random.Random(0)).admitted) == 4
    return view


def test_a_reservation_never_stops_work_that_may_preempt() -> None:
    """The head (best-effort, 4 devices) cannot preempt its equals: it is reserved for t=1000. A
    critical job after it does not fit and preempts one best-effort run at once (before, any
    reservation turned preemption off for the rest of the cycle), and the head is reserved again
    on the pool the preemption leaves: still t=1000, the preempted run requeued."""
    head = _classed(4, "head", 10, 50.0, "best-effort")
    critical = _classed(1, "critical", 11, 50.0, "critical")
    result = cycle_on(_best_effort_full(), [head, critical], FULL, 20.0, random.Random(0))
    assert [a.workload_id for a in result.admitted] == ["critical"]
    assert len(result.preempted) == 1 and result.preempted[0].preemptor_id == "critical"
    assert result.reservation is not None and result.reservation.workload_id == "head"
    assert result.reservation.start_s == 1000.0


def test_work_of_a_higher_class_than_the_head_is_not_held_back_by_its_reservation() -> None:
    """Two free devices the head (normal, 4 devices, reserved at t=100 on node A) needs: a long
    high-priority job that fits there starts (it could preempt the head were the head running),
    and the head is reserved again behind it; a long job of the head's own class is refused."""
    view = _two_nodes()  # A: r1 (2 devices) until t=100; B: r2 (3 devices) until t=1000
    pending = [_w(4, "head", 1, 50.0), _classed(2, "high", 2, 5000.0, "high"), _w(1, "same", 3, 5000.0)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle, "beside_reserved", False)
        result = cycle_on(view, pending, FULL, 0.0, random.Random(0))
    assert [a.workload_id for a in result.admitted] == ["high"]
    assert result.reservation is not None and result.reservation.workload_id == "head"
    assert result.reservation.start_s == 1000.0  # A now holds `high` until t=5000: B frees at 1000
    assert {r.workload_id: r.reason for r in result.rejected}["same"] == Reason.BACKFILL_BLOCKED


def test_small_work_refused_on_the_reserved_node_starts_beside_it() -> None:
    """The head (4 devices) is reserved on A at t=100; a long 0.3-GPU job the policy places on A
    is placed again off A and starts on B at once, where it leaves the head's placement whole."""
    pending = [_w(4, "head", 1, 50.0), _w(0.3, "small", 2, 5000.0)]
    view = _two_nodes()
    result = cycle_on(view, pending, EASY, 0.0, random.Random(0))
    assert [a.workload_id for a in result.admitted] == ["small"]
    node = result.admitted[0].placements[0].node
    assert node == view.state.nodes[1].name
    assert result.reservation is not None and result.reservation.start_s == 100.0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle, "beside_reserved", False)
        before = cycle_on(_two_nodes(), pending, EASY, 0.0, random.Random(0))
    assert not before.admitted
    assert {r.workload_id: r.reason for r in before.rejected}["small"] == Reason.BACKFILL_BLOCKED


def test_a_reserved_start_slides_only_by_the_correction_of_the_run_it_waits_on() -> None:
    """The head (5 devices) waits on a1 (planned end 100): reserved at 100, again at 90. Once a1
    runs over, its estimate doubled puts it at 200: the start slides once, by that correction
    alone (100 s), and the view counts it; a cycle at 160 keeps 200 (no slide)."""
    view = _overdue_view()
    head = _w(5, "head", 1, 50.0)
    starts = []
    for now_s in (50.0, 90.0, 150.0, 160.0):
        result = cycle_on(view, [head], EASY, now_s, random.Random(0))
        assert result.reservation is not None and result.reservation.workload_id == "head"
        starts.append((result.reservation.start_s, result.reservation.slid_s))
    assert starts == [(100.0, 0.0), (100.0, 0.0), (200.0, 100.0), (200.0, 100.0)]
    assert (view.reservation_slides, view.reservation_slid_s) == (1, 100.0)
    run = view.running["a1"]
    assert corrected_end_s(run, 150.0) - run.planned_end_s == 100.0


def test_work_of_a_higher_class_goes_beside_the_reserved_node_when_it_fits_there() -> None:
    """The head (4 devices) is reserved on A at t=100. A long high-priority 1-device job, which
    first-fit puts on A, starts on B (one device free) instead: the head keeps its start. With
    nothing free on B it takes A and the head is reserved again, behind it."""
    pending = [_w(4, "head", 1, 50.0), _classed(1, "high", 2, 5000.0, "high")]
    view = _two_nodes()
    result = cycle_on(view, pending, FULL, 0.0, random.Random(0))
    assert [a.workload_id for a in result.admitted] == ["high"]
    assert result.admitted[0].placements[0].node == view.state.nodes[1].name
    assert result.reservation is not None and result.reservation.start_s == 100.0
    full_b = ClusterView.empty(cluster(2, devices=4))  # as _two_nodes, but r2 fills B
    first = cycle_on(full_b, [_w(2, "r1", 0, 100.0), _w(4, "r2", 0.5, 1000.0)], EASY, 0.0, random.Random(0))
    assert [a.placements[0].node for a in first.admitted] == [n.name for n in full_b.state.nodes]
    again = cycle_on(full_b, pending, FULL, 0.0, random.Random(0))
    assert [a.workload_id for a in again.admitted] == ["high"]
    assert again.admitted[0].placements[0].node == full_b.state.nodes[0].name
    assert again.reservation is not None and again.reservation.start_s == 1000.0
