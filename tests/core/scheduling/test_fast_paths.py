"""The cycle's optimised paths decide exactly as the plain definitions they stand for."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import test_admission_properties as props
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import node
from gpupool.core.model import PodRequest, Workload
from gpupool.core.priority import PriorityClasses
from gpupool.core.scheduling.ordering.base import SHARE_RESOURCES, demand_of
from gpupool.core.scheduling.ordering.drf import Drf, _Book
from gpupool.core.scheduling.preemption import FirstPodFits, node_fits_at
from gpupool.core.state import ClusterState, release_many

pods = st.builds(
    lambda num, milli, cpu, mem, dev_mem, models: PodRequest(
        "p", cpu_milli=cpu, memory_mib=mem, num_devices=num,
        device_milli=(milli if num == 1 else 1000) if num else 0,
        device_memory_mib=dev_mem if num else 0, allowed_models=models,
    ),
    st.integers(0, 4),
    st.sampled_from([250, 500, 1000]),
    st.sampled_from([0, 4000, 30_000]),
    st.sampled_from([0, 16_384, 200_000]),
    st.sampled_from([0, 8_192, 30_000]),
    st.sampled_from([frozenset(), frozenset({"A100"}), frozenset({"V100M32"})]),
)


def _busy_state(seed: int) -> tuple[ClusterState, list]:  # type: ignore[type-arg]
    """Six nodes of two models, randomly filled with one-device pods; the records taken."""
    rng = random.Random(seed)
    nodes = [node(f"n{i}", devices=4, model="A100" if i % 2 else "V100M32") for i in range(6)]
    state = ClusterState(nodes)
    records = []
    for _ in range(40):
        n, d = rng.randrange(6), rng.randrange(4)
        milli = rng.choice([250, 500, 1000])
        if state.dev_milli_free[n, d] >= milli and state.cpu_free[n] >= 8000:
            record = state.make_alloc(PodRequest("x", cpu_milli=8000, memory_mib=32_768, num_devices=1,
                                                 device_milli=milli, device_memory_mib=4096), n, [d])
            if (state.dev_mem_free[n, d] >= 4096) and state.mem_free[n] >= 32_768:
                state.allocate(record)
                records.append(record)
    if rng.random() < 0.3:
        state.schedulable[rng.randrange(6)] = False
    return state, records


@settings(max_examples=200, deadline=None)
@given(pods, st.integers(0, 10_000), st.sets(st.integers(0, 5)))
def test_node_fits_at_is_node_fits_on_those_nodes(pod: PodRequest, seed: int, rows: set[int]) -> None:
    state, _ = _busy_state(seed)
    assert node_fits_at(state, pod, rows) == bool(state.node_fits(pod)[sorted(rows)].any())


class _Run:
    """What FirstPodFits reads of a detached victim: its allocations."""

    def __init__(self, record) -> None:  # type: ignore[no-untyped-def]
        self.allocs = ((None, record),)


@settings(max_examples=150, deadline=None)
@given(pods, st.integers(0, 10_000))
def test_first_pod_fits_follows_releases_as_a_full_scan_does(pod: PodRequest, seed: int) -> None:
    """Releasing victims one by one, the incremental answer equals `node_fits(pod).any()` each time."""
    state, records = _busy_state(seed)
    random.Random(seed).shuffle(records)
    tracker = FirstPodFits(state, pod)
    for k, record in enumerate(records):
        state.release(record)
        tracker.freed(_Run(record))  # type: ignore[arg-type]
        if k % 3 == 2:  # the greedy search asks only once enough compute is freed: not every time
            assert tracker.fits_somewhere() == bool(state.node_fits(pod).any())
    assert tracker.fits_somewhere() == bool(state.node_fits(pod).any())


def _drf_workload(i: int, tenant: str, klass: str, submit: float) -> Workload:
    return Workload(id=f"w{i}", pods=(PodRequest("p", num_devices=1, device_milli=1000),), tenant=tenant,
                    priority_class=klass, submit_time_s=submit)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from("abc"), st.sampled_from(["high", "normal"]),
                          st.integers(0, 5)), min_size=1, max_size=40))
def test_drf_keeps_the_sorted_queue_across_cycles_in_the_order_a_full_sort_gives(steps: list) -> None:
    """Arrivals, departures and a resubmitted id (new contents): the kept order is the full sort's."""
    classes = PriorityClasses()
    memo: dict = {}
    pending: dict[str, Workload] = {}
    for i, (leave, tenant, klass, submit) in enumerate(steps):
        if leave and pending:
            del pending[sorted(pending)[i % len(pending)]]
        w = _drf_workload(i % 7, tenant, klass, float(submit))  # ids recur: a resubmission
        pending[w.id] = w
        listed = list(pending.values())
        book = memo.setdefault("book", _Book())
        book.update(listed, classes.rank, demand_of)
        queues = [(band, tenant, book.bands[band][tenant]) for band in sorted(book.bands)
                  for tenant in sorted(book.bands[band])]
        kept = [(band, tenant, *key, w) for band, tenant, queue in queues
                for key, w in zip(queue.keys, queue.workloads, strict=True)]
        full = sorted((-classes.rank(w)[0], w.tenant, -classes.rank(w)[1], w.submit_time_s, w.id, w)
                      for w in listed)
        assert kept == full
        for band in book.bands.values():  # each queue's demand, summed as it changed
            for queue in band.values():
                assert queue.total == [sum(demand_of(w)[r] for w in queue.workloads) for r in SHARE_RESOURCES]


@settings(max_examples=30, deadline=None)
@given(st.one_of(props.ops, props.narrow_ops), st.booleans(), st.booleans())
def test_drf_kept_order_decides_as_sorting_afresh(sequence: list, preemption: bool, backfill: bool) -> None:
    policies = replace(props.BASE, ordering="drf", preemption=preemption, backfill=backfill)
    kept = props._drive(sequence, policies, seed=5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Drf, "keep_order", False)
        fresh = props._drive(sequence, policies, seed=5)
    assert kept == fresh


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 40))
def test_release_many_gives_back_what_releasing_one_by_one_does(seed: int, count: int) -> None:
    """Few records are applied in a loop, many with np.add.at: either way as `release` one by one."""
    bulk, records = _busy_state(seed)
    single, _ = _busy_state(seed)
    chosen = records[:count]
    release_many(bulk, chosen)
    for record in chosen:
        single.release(record)
    for name in ("cpu_free", "mem_free", "dev_milli_free", "dev_mem_free", "node_version"):
        assert (getattr(bulk, name) == getattr(single, name)).all(), name
    assert bulk.node_pod_kinds == single.node_pod_kinds
