"""The walk over the pending queue takes work whose (queue, shape, rank) already has this cycle's
verdict inline (`_Cycle.group_walk`), and drf's stream adds and divides the three share resources
unrolled (`_DrfStream.unroll`): the same decisions in the same order, and the same order of work."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
import test_admission_properties as props
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import cluster
from gpupool.core.model import PodRequest, Workload
from gpupool.core.priority import PriorityClasses
from gpupool.core.quota import QuotaConfig
from gpupool.core.scheduling import cycle
from gpupool.core.scheduling.cycle import CycleResult, Policies, Wait, cycle_on
from gpupool.core.scheduling.gang import GangPlacement, place_gang
from gpupool.core.scheduling.ordering import drf
from gpupool.core.scheduling.ordering.base import OrderingContext, demand_of, make_ordering
from gpupool.core.scheduling.policies.base import make_policy
from gpupool.core.scheduling.view import ClusterView

CLASSES = PriorityClasses()


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(props.ops, props.narrow_ops),
    st.sampled_from(["fifo", "priority-fifo", "drf", "las"]),
    st.booleans(),
    st.booleans(),
)
def test_the_inline_walk_decides_as_considering_each(
    sequence: list, ordering: str, preemption: bool, backfill: bool
) -> None:
    """Every decision, in the order made (waits included), is the one considering each workload
    gives: arrivals and finishes, preemptions, reservations, blocked queues (fifo)."""
    policies = replace(props.BASE, ordering=ordering, preemption=preemption, backfill=backfill)
    inline, inline_books = _driven(sequence, policies, True)
    each, each_books = _driven(sequence, policies, False)
    assert inline == each
    assert inline_books == each_books


def _driven(sequence: list, policies: Policies, inline: bool) -> tuple[list[CycleResult], list[object]]:
    """The results, and each cycle's books once its walk ended: the work left to reach per key,
    the keys still live, the verdicts settled and the queues blocked."""
    books: list[object] = []
    run = cycle._Cycle.run

    def noted(self: Any, pending: Any) -> CycleResult:
        result = run(self, pending)
        books.append((dict(self.left), set(self.live), dict(self.settled), set(self.blocked)))
        return result

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle._Cycle, "run", noted)
        mp.setattr(cycle._Cycle, "group_walk", inline)
        return props._drive(sequence, policies, seed=4), books


def _job(i: int, devices: int, tenant: str, klass: str = "normal") -> Workload:
    pods = (PodRequest("p", cpu_milli=100, num_devices=devices, device_milli=1000),)
    return Workload(id=f"w{i:03d}", pods=pods, tenant=tenant, priority_class=klass, submit_time_s=float(i))


def _backed_up() -> tuple[ClusterView, list[Workload]]:
    """A full pool; 40 one-device jobs of three tenants, then one two-device job at the end."""
    view = ClusterView.empty(cluster(2, devices=4), QuotaConfig(), CLASSES)
    rng = random.Random(0)
    for k in range(8):
        filler = _job(900 + k, 1, "d", "critical")
        gang = place_gang(filler, view.state, make_policy("first-fit"), rng)
        assert isinstance(gang, GangPlacement)
        view.admit(filler, gang, view.cluster_queue(filler) or "", 0.0)  # (placed: the view records it)
    pending = [_job(i, 1, "abc"[i % 3]) for i in range(40)] + [_job(40, 2, "a")]
    return view, pending


def _considered(ordering: str, inline: bool) -> tuple[int, CycleResult]:
    view, pending = _backed_up()
    calls = []
    original = cycle._Cycle._consider

    def counted(self: Any, w: Workload, meta: Any) -> None:
        calls.append(w.id)
        original(self, w, meta)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle._Cycle, "_consider", counted)
        mp.setattr(cycle._Cycle, "group_walk", inline)
        result = cycle_on(view, pending, Policies(placement="first-fit", ordering=ordering), 10.0,
                          random.Random(1))
    return len(calls), result


@pytest.mark.parametrize("ordering", ["drf", "priority-fifo", "las"])
def test_work_whose_key_has_its_verdict_is_not_considered_again(ordering: str) -> None:
    """The first one-device job fails and settles its key; its 39 others wait with that verdict
    without a consideration each, up to the two-device job, whose key is still to be tried."""
    inline, result = _considered(ordering, True)
    each, walked = _considered(ordering, False)
    assert result == walked
    assert each == 41
    assert inline == 2
    assert [(type(d), d.workload_id) for d in result.decisions] == [(Wait, w.id) for w in _ordered(ordering)]
    assert len({d[1:] for d in result.decisions[:40]}) == 1  # the first one's verdict, 40 times


def _ordered(ordering: str) -> list[Workload]:
    view, pending = _backed_up()
    ctx = OrderingContext(now_s=10.0, rank=CLASSES.rank, capacity=view.capacity(),
                          tenant_usage=view.tenant_usage)
    return make_ordering(ordering).order(pending, ctx)


def _pending(draw: st.DrawFn) -> tuple[list[Workload], dict[str, dict[str, float]], dict[str, float]]:
    n = draw(st.integers(1, 40))
    ws = []
    for i in range(n):
        devices = [draw(st.integers(0, 4)) for _ in range(draw(st.integers(1, 3)))]
        pods = tuple(PodRequest(f"p{k}", cpu_milli=draw(st.sampled_from([0, 100, 4000, 30_000])),
                                memory_mib=draw(st.sampled_from([0, 512, 16_384, 300_000])),
                                num_devices=d, device_milli=1000 if d else 0)
                     for k, d in enumerate(devices))
        ws.append(Workload(id=f"w{i}", pods=pods, tenant=draw(st.sampled_from("abcd")),
                           priority_class=draw(st.sampled_from(["high", "normal", "best-effort"])),
                           submit_time_s=float(draw(st.integers(0, 9)))))
    usage = {t: {"device_milli": float(draw(st.integers(0, 20)) * 1000),
                 "cpu_milli": float(draw(st.integers(0, 200_000))),
                 "memory_mib": float(draw(st.integers(0, 2_000_000)))} for t in "abcd" if draw(st.booleans())}
    weights = {t: draw(st.sampled_from([0.5, 1.0, 3.0])) for t in "abcd" if draw(st.booleans())}
    return ws, usage, weights


def _plain_drf(pending: list[Workload], ctx: OrderingContext) -> list[Workload]:
    """Progressive filling by its definition: per band, the smallest (weighted dominant share,
    tenant) goes next, its usage grown by each one given, each share computed afresh."""
    usage = {t: dict(u) for t, u in ctx.tenant_usage.items()}
    out = []
    for band in sorted({ctx.rank(w)[0] for w in pending}, reverse=True):
        queues = {}
        for w in sorted((w for w in pending if ctx.rank(w)[0] == band),
                        key=lambda w: (-ctx.rank(w)[1], w.submit_time_s, w.id)):
            queues.setdefault(w.tenant, []).append(w)
        while queues:
            tenant = min(queues, key=lambda t: (drf.dominant_share(usage.setdefault(t, {}), ctx, t), t))
            w = queues[tenant].pop(0)
            mine = usage[tenant]
            for r, a in demand_of(w).items():
                mine[r] = mine.get(r, 0.0) + a
            out.append(w)
            if not queues[tenant]:
                del queues[tenant]
    return out


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_drf_unrolled_gives_the_order_of_progressive_filling(data: st.DataObject) -> None:
    """The order is the plain definition's, and the one through `_add` and `_share`; the shares of
    the work given are computed unrolled (`_share` runs only as each band opens, once a tenant)."""
    pending, usage, weights = data.draw(st.composite(lambda draw: _pending(draw))())
    capacity = {"device_milli": 16_000.0, "cpu_milli": 128_000.0, "memory_mib": 900_000.0}
    ctx = OrderingContext(now_s=0.0, rank=CLASSES.rank, tenant_usage=usage, tenant_weights=weights,
                          capacity=capacity)
    shares = []
    original = drf._DrfStream._share

    def counted(self: Any, tenant: str) -> float:
        shares.append(tenant)
        return original(self, tenant)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(drf._DrfStream, "_share", counted)
        unrolled = make_ordering("drf").order(pending, ctx)
        opened = len(shares)
        mp.setattr(drf._DrfStream, "unroll", False)
        called = make_ordering("drf").order(pending, ctx)
    assert unrolled == called == _plain_drf(pending, ctx)
    bands = {(CLASSES.rank(w)[0], w.tenant) for w in pending}
    assert opened == len(bands)
