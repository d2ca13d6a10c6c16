"""Each ordering policy on hand-made pending lists."""

from __future__ import annotations

from dataclasses import replace

import pytest

from factories import pod, workload
from gpupool.core.model import WorkloadInfo
from gpupool.core.priority import PriorityClasses
from gpupool.core.scheduling.ordering.base import OrderingContext, make_ordering, ordering_names
from gpupool.errors import UnknownName

CLASSES = PriorityClasses()


def _ctx(**kw: object) -> OrderingContext:
    base: dict[str, object] = {
        "now_s": 100.0,
        "rank": CLASSES.rank,
        "capacity": {"device_milli": 8000.0, "cpu_milli": 64000.0, "memory_mib": 1e6},
    }
    base.update(kw)
    return OrderingContext(**base)  # type: ignore[arg-type]


def _ids(ws: list) -> list[str]:
    return [w.id for w in ws]


def test_registry_lists_all_and_rejects_unknown() -> None:
    assert {"fifo", "priority-fifo", "drf", "las"} <= set(ordering_names())
    with pytest.raises(UnknownName, match="Did you mean 'drf'"):
        make_ordering("drff")


def test_fifo_ignores_priority_and_is_strict() -> None:
    ws = [workload(wid="late", submit_s=5, priority=9), workload(wid="early", submit_s=1)]
    fifo = make_ordering("fifo")
    assert fifo.strict
    assert _ids(fifo.order(ws, _ctx())) == ["early", "late"]


def test_priority_fifo_puts_classes_first_then_age() -> None:
    ws = [
        workload(wid="old-normal", submit_s=0),
        replace(workload(wid="new-high", submit_s=9), priority_class="high"),
        replace(workload(wid="be", submit_s=-5), priority_class="best-effort"),
        workload(wid="new-normal-prio", submit_s=3, priority=2),
    ]
    order = make_ordering("priority-fifo").order(ws, _ctx())
    assert _ids(order) == ["new-high", "new-normal-prio", "old-normal", "be"]


def test_drf_serves_the_tenant_with_the_smallest_dominant_share() -> None:
    ws = [workload(pod(1), wid=f"a{i}", submit_s=i, tenant="a") for i in range(3)]
    ws += [workload(pod(1), wid=f"b{i}", submit_s=10 + i, tenant="b") for i in range(3)]
    ctx = _ctx(tenant_usage={"a": {"device_milli": 4000.0}})
    order = _ids(make_ordering("drf").order(ws, ctx))
    # b holds nothing: it goes until its share catches up with a's (4 devices), then they alternate
    assert order[:3] == ["b0", "b1", "b2"]
    assert order[3:] == ["a0", "a1", "a2"]


def test_drf_interleaves_equal_tenants_and_respects_weights() -> None:
    ws = [workload(pod(1), wid=f"{t}{i}", submit_s=i, tenant=t) for t in "ab" for i in range(2)]
    assert _ids(make_ordering("drf").order(ws, _ctx())) == ["a0", "b0", "a1", "b1"]
    weighted = _ctx(
        tenant_weights={"b": 3.0}, tenant_usage={"b": {"device_milli": 2000.0}, "a": {"device_milli": 1000.0}}
    )
    assert _ids(make_ordering("drf").order(ws, weighted))[0] == "b0"


def test_las_prefers_least_attained_service() -> None:
    ws = [workload(wid="veteran", submit_s=0), workload(wid="fresh", submit_s=5)]
    ctx = _ctx(info={"veteran": WorkloadInfo(attained_service_s=7200.0)})
    assert _ids(make_ordering("las").order(ws, ctx)) == ["fresh", "veteran"]
    # within one service queue it is FIFO
    ctx2 = _ctx(info={"veteran": WorkloadInfo(attained_service_s=10.0)})
    assert _ids(make_ordering("las").order(ws, ctx2)) == ["veteran", "fresh"]


@pytest.mark.parametrize("name", ["drf", "priority-fifo", "las"])
def test_skipping_a_band_leaves_the_later_bands_as_they_were(name: str) -> None:
    # high band: a asks for 1 + 2 + 1 devices, b for 1; normal band: three each
    high = [workload(pod(g), wid=f"ha{i}", submit_s=i, tenant="a") for i, g in enumerate((1, 2, 1))]
    high.append(workload(pod(1), wid="hb0", submit_s=0, tenant="b"))
    ws = [replace(w, priority_class="high") for w in high]
    ws += [workload(pod(1), wid=f"n{t}{i}", submit_s=i, tenant=t) for t in "ab" for i in range(3)]
    ctx = _ctx(tenant_usage={"b": {"device_milli": 2000.0}})
    ordering = make_ordering(name)
    assert ordering.banded
    full = _ids(ordering.order(ws, ctx))
    stream = ordering.stream(ws, ctx)
    first = stream.next_workload()
    assert first is not None and first.id == full[0] == "ha0"
    skipped = _ids(stream.skip_band())
    assert sorted(skipped) == sorted(full[1:4]) == ["ha1", "ha2", "hb0"]  # the rest of the band
    rest = []
    while (w := stream.next_workload()) is not None:
        rest.append(w.id)
    assert rest == full[4:]
    if name == "drf":
        # the high band leaves a at 4 devices and b at 3 (counting what was skipped): b goes first
        assert rest[0] == "nb0"


def test_fifo_is_not_banded() -> None:
    fifo = make_ordering("fifo")
    assert not fifo.banded
    stream = fifo.stream([workload(wid="x", submit_s=1), workload(wid="y", submit_s=2)], _ctx())
    assert stream.next_workload() is not None
    assert stream.skip_band() == []
