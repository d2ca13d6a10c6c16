"""EASY backfill: the head keeps its reserved start; estimates come from the user or history."""

from __future__ import annotations

import random
from dataclasses import replace

from factories import cluster, pod, workload
from gpupool.core.model import Reason, Workload
from gpupool.core.scheduling.backfill import RuntimeEstimator, reserve
from gpupool.core.scheduling.cycle import Policies, cycle_on
from gpupool.core.scheduling.policies.base import make_policy
from gpupool.core.scheduling.view import ClusterView

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


def test_estimator_prefers_user_then_name_then_tenant_and_measures_error() -> None:
    est = RuntimeEstimator()
    w = replace(workload(wid="a", tenant="t"), name="train")
    assert est.estimate_s(w) is None
    est.observe(w, 100.0, None)
    est.observe(w, 300.0, 100.0)
    assert est.estimate_s(replace(w, id="b")) == 200.0
    other = replace(workload(wid="c", tenant="t"), name="other")
    assert est.estimate_s(other) == 200.0
    assert est.estimate_s(replace(other, runtime_estimate_s=7.0)) == 7.0
    assert est.history_error.summary()["mean_abs_error_s"] == 200.0
    assert est.history_error.summary()["underestimated_pct"] == 100.0
