"""Kueue-style quotas: nominal, borrowing and lending limits inside a cohort."""

from __future__ import annotations

import pytest

from factories import workload
from gpupool.core.quota import (
    DEVICE_MILLI,
    ClusterQueue,
    LocalQueue,
    QuotaConfig,
    QuotaTracker,
    ResourceQuota,
    cluster_queue_of,
    devices_milli,
)
from gpupool.errors import InvalidInput


def _config(a: ResourceQuota, b: ResourceQuota, cohort: str = "pool") -> QuotaConfig:
    return QuotaConfig(
        cluster_queues=(
            ClusterQueue("a", {DEVICE_MILLI: a}, cohort),
            ClusterQueue("b", {DEVICE_MILLI: b}, cohort),
        )
    )


def test_without_cohort_nominal_is_the_ceiling() -> None:
    t = QuotaTracker(_config(ResourceQuota(devices_milli(2)), ResourceQuota(0), cohort=""))
    assert t.fits("a", {DEVICE_MILLI: 2000}) is None
    t.add("a", {DEVICE_MILLI: 2000})
    assert "nominal" in (t.fits("a", {DEVICE_MILLI: 1}) or "")


def test_borrowing_from_an_idle_cohort_member_up_to_its_borrowing_limit() -> None:
    t = QuotaTracker(_config(ResourceQuota(2000, borrowing_limit=1000), ResourceQuota(4000)))
    assert t.fits("a", {DEVICE_MILLI: 3000}) is None
    assert "borrowing limit" in (t.fits("a", {DEVICE_MILLI: 3001}) or "")
    t.add("a", {DEVICE_MILLI: 3000})
    assert t.is_borrowing("a")
    # b lent 1000 of its 4000: it can use only 3000 until it reclaims
    assert t.fits("b", {DEVICE_MILLI: 3000}) is None
    assert t.fits("b", {DEVICE_MILLI: 3001}) is not None
    assert t.within_nominal("b", {DEVICE_MILLI: 4000})
    t.check_invariants()


def test_lending_limit_keeps_a_guaranteed_part() -> None:
    t = QuotaTracker(_config(ResourceQuota(1000), ResourceQuota(4000, lending_limit=1000)))
    assert t.fits("a", {DEVICE_MILLI: 2000}) is None
    assert t.fits("a", {DEVICE_MILLI: 2001}) is not None
    assert t.ever_fits("a", {DEVICE_MILLI: 2001}) is not None


def test_remove_gives_quota_back() -> None:
    t = QuotaTracker(_config(ResourceQuota(1000), ResourceQuota(1000)))
    t.add("a", {DEVICE_MILLI: 2000})
    assert t.fits("b", {DEVICE_MILLI: 1}) is not None
    t.remove("a", {DEVICE_MILLI: 2000})
    assert t.fits("b", {DEVICE_MILLI: 2000}) is None


def test_local_queues_route_tenants_to_cluster_queues() -> None:
    cfg = QuotaConfig(
        cluster_queues=(ClusterQueue("gpu", {DEVICE_MILLI: ResourceQuota(1000)}),),
        local_queues=(LocalQueue("team-a", "train", "gpu"),),
    )
    route = cfg.route()
    assert (
        cluster_queue_of(
            cfg,
            route,
            workload(tenant="team-a").__class__(id="x", pods=workload().pods, tenant="team-a", queue="train"),
        )
        == "gpu"
    )
    assert cluster_queue_of(cfg, route, workload(tenant="team-b")) is None
    assert cluster_queue_of(QuotaConfig(), {}, workload()) == ""


def test_bad_quota_is_refused() -> None:
    with pytest.raises(InvalidInput):
        ResourceQuota(1000, lending_limit=2000)
    with pytest.raises(InvalidInput):
        QuotaConfig(local_queues=(LocalQueue("t", "q", "missing"),))


def test_guaranteed_quota_fits_while_the_cohort_is_overdrawn() -> None:
    # b (nominal 4000) borrowed a's lendable 1000, then b's quota was lowered to 1000 under what b
    # runs: the cohort lends more than its members allow, yet a's guaranteed part (never lendable)
    # must stay usable
    lowered = QuotaTracker(_config(ResourceQuota(3000, lending_limit=1000), ResourceQuota(1000)))
    lowered.add("b", {DEVICE_MILLI: 5000})
    with pytest.raises(InvalidInput):
        lowered.check_invariants()
    assert lowered.fits("a", {DEVICE_MILLI: 2000}) is None  # a's guaranteed 2000
    assert "no device_milli left to lend" in (lowered.fits("a", {DEVICE_MILLI: 2001}) or "")
    assert lowered.fits("b", {DEVICE_MILLI: 1}) is not None
