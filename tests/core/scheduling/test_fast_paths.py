"""The cycle's optimised paths decide exactly as the plain definitions they stand for."""

from __future__ import annotations

import bisect
import heapq
import random
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import test_admission_properties as props
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from factories import node
from gpupool.core.model import PodRequest, Workload
from gpupool.core.priority import PriorityClasses, Rank
from gpupool.core.scheduling import backfill
from gpupool.core.scheduling.gang import place_gang
from gpupool.core.scheduling.ordering.base import SHARE_RESOURCES, demand_of
from gpupool.core.scheduling.ordering.drf import Drf, _Book
from gpupool.core.scheduling.policies.base import NoFit, make_policy
from gpupool.core.scheduling.preemption import (
    FirstPodFits,
    SortedGroup,
    VictimIndex,
    lost_device_s,
    node_fits_at,
)
from gpupool.core.scheduling.victim_state import PutBack, detach_all
from gpupool.core.scheduling.view import ClusterView, Running
from gpupool.core.state import ClusterState, release_many, row_counts, row_sums, rows_all

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import cycle_latency

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


@settings(max_examples=150, deadline=None)
@given(pods, st.integers(0, 10_000))
def test_first_pod_fits_keeps_each_touched_nodes_slacks(pod: PodRequest, seed: int) -> None:
    """Told of each victim before it leaves the state (as the greedy search does), the tracker's
    amounts for a node are its free cpu and memory less the pod's, its devices with a share free
    less the pod's devices, and each device's free milli (a refused model never enough): the
    bound is then exactly 'enough cpu, memory and devices', so no node the pod fits is left out."""
    state, records = _busy_state(seed)
    random.Random(seed).shuffle(records)
    tracker = FirstPodFits(state, pod)
    tracker.start()
    share = min(pod.device_milli, 1000)
    cpu, mem = state.cpu_need(pod), state.mem_need(pod)
    for record in records:
        tracker.freed(_Run(record))  # type: ignore[arg-type]
        state.release(record)
        fits = state.node_fits(pod)
        for n, amounts in tracker.free.items():
            if state.schedulable[n]:
                assert amounts[0] == state.cpu_free[n] - (cpu[n] if isinstance(cpu, np.ndarray) else cpu)
            else:
                assert amounts[0] < 0
            assert amounts[1] == state.mem_free[n] - (mem[n] if isinstance(mem, np.ndarray) else mem)
            if pod.num_devices:
                allowed = state.allowed_devices(pod.allowed_models)[n]
                row = state.dev_milli_free[n]
                free = [int(m) if ok else None for m, ok in zip(row, allowed, strict=True)]
                assert [m if m >= 0 else None for m in amounts[3:]] == free
                assert amounts[2] == sum(1 for m in free if m is not None and m >= share) - pod.num_devices
            else:
                assert amounts[2] == 0 and len(amounts) == 3
            assert tracker._within(n, amounts) or not fits[n]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([(1, 1000), (2, 1000), (4, 1000), (8, 1000)]))
def test_putting_victims_back_watches_only_their_nodes_where_the_pod_fitted_nowhere(
        seed: int, shape: tuple[int, int]) -> None:
    """Where the pod fitted no node before the victims went, the first scan of where it fits after
    they went reads the victims' nodes alone: every answer as with the scan of every node."""
    rng = random.Random(seed)
    snapshot, _ = cycle_latency.build(40, 0, seed)
    view = ClusterView.from_snapshot(snapshot, classes=PriorityClasses())
    view.materialize()
    pod = PodRequest("p", cpu_milli=4000 * shape[0], memory_mib=16_384 * shape[0], num_devices=shape[0],
                     device_milli=shape[1])
    assume(not view.state.node_fits(pod).any())  # (the benchmark's pool is full: most seeds)
    runs = rng.sample(sorted(view.running.values(), key=lambda r: r.workload.id), 60)
    detach_all(view, runs)
    nodes = sorted({a.node for run in runs for _, a in run.allocs})
    batches = [runs[i:i + 7] for i in range(0, len(runs), 7)]
    answers = []
    for only in (None, nodes):
        back = PutBack(view, pod, watch=True, only=only)
        seen = []
        for k, batch in enumerate(batches):
            seen.append((back.attach(batch), back.fitting.tolist()))  # type: ignore[union-attr]
            if k % 2:
                back.undo()
        answers.append(seen)
        detach_all(view, [run for k, batch in enumerate(batches) if not k % 2 for run in batch])  # as before
    assert answers[0] == answers[1]


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


@settings(max_examples=200, deadline=None)
@given(pods, st.integers(0, 10_000), st.lists(st.integers(0, 5), unique=True))
def test_node_fits_rows_is_node_fits_on_those_nodes(pod: PodRequest, seed: int, rows: list[int]) -> None:
    state, _ = _busy_state(seed)
    assert state.node_fits_rows(pod, rows).tolist() == state.node_fits(pod)[rows].tolist()


@settings(max_examples=60, deadline=None)
@given(pods, st.integers(0, 10_000), st.lists(st.integers(0, 5), max_size=6))
def test_device_fits_at_is_device_fits_on_those_nodes(pod: PodRequest, seed: int, rows: list[int]) -> None:
    state, _ = _busy_state(seed)
    at = np.asarray(rows, dtype=np.intp)
    assert state.device_fits_at(pod, at).tolist() == state.device_fits(pod)[at].tolist()
    for n in rows:  # one node's row (the slots a pod placed there takes)
        assert state.device_fits_at(pod, n).tolist() == state.device_fits(pod)[n].tolist()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([1, 2, 3, 4, 8, 16, 255, 256, 300]), st.integers(0, 70),
       st.floats(0.0, 1.0))
def test_row_counts_are_the_sums_of_the_rows(seed: int, width: int, rows: int, share: float) -> None:
    """`row_counts`, `rows_all` and `row_sums` give numpy's sums and `all` of every row, for rows of
    any width, laid out either way (whole rows of 2, 4 and 8 slots are read as one integer each)."""
    rng = np.random.default_rng(seed)
    mask = rng.random((rows, width)) < share
    mask[: rows // 3] = True  # (full rows: every byte set)
    for m in (mask, mask[:, ::2], np.asfortranarray(mask), mask[::-1]):
        counts = row_counts(m)
        assert counts.dtype == np.int64 and counts.tolist() == m.sum(axis=1).tolist()
        assert rows_all(m).tolist() == m.all(axis=1).tolist()
    values = rng.integers(-(1 << 40), 1 << 40, (rows, width))
    for v in (values, values[:, ::2], values[::-1], values * mask):
        assert row_sums(v).tolist() == v.sum(axis=1).tolist()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.5, 2.0, 7.25, 1e9]), max_size=300), st.integers(0, 10_000),
       st.sampled_from([(1, 0), (2, 0), (2, 1)]))
def test_a_sorted_group_reads_as_its_full_sort(costs: list[float], seed: int, rank: Rank) -> None:
    """A group made into entries as it is read gives the list a full sort of (cost, rank, id) gives:
    read whole or in pieces by several readers at once, from the position after any key (costs
    tied, keys of other ranks and ids between its own), and each run's cost by id."""
    rng = random.Random(seed)
    ids = sorted(f"w{i:04d}" for i in rng.sample(range(5000), len(costs)))
    runs = [object() for _ in ids]
    full = sorted(zip(costs, [rank] * len(ids), ids, runs, strict=True), key=lambda e: e[:3])
    group = SortedGroup(rank, ids, runs, costs)  # type: ignore[arg-type]
    starts = [rng.randrange(len(ids) + 1) for _ in range(3)]
    readers = [group.read(start) for start in starts]
    got: list[list[object]] = [[], [], []]
    live = [0, 1, 2]
    while live:  # the readers interleaved, a few entries each in turn (the list grows under them)
        i = rng.choice(live)
        for _ in range(rng.randrange(1, 40)):
            entry = next(readers[i], None)
            if entry is None:
                live.remove(i)
                break
            got[i].append(entry)
    assert got == [full[start:] for start in starts]
    assert group.all() == full and list(group.read()) == full
    keys = [e[:3] for e in full] + [(c, r, f"w{rng.randrange(5000):04d}") for c in (0.0, 2.0, 1e9, 3.0)
                                    for r in ((1, 0), (2, 0), (2, 1), (3, 0))]
    for key in keys:
        at = group.after(key)
        assert at == bisect.bisect_right(full, key, key=lambda e: e[:3])
        assert list(group.read(at)) == full[at:]
    for cost, _, wid, _ in full:
        assert group.cost_of(wid) == cost
    present = set(ids)
    absent = [wid for wid in (f"w{i:04d}" for i in rng.sample(range(5000), 50)) if wid not in present]
    assert all(group.cost_of(wid) is None for wid in [*absent, "a", "x"])


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000))
def test_victim_groups_follow_the_running_work(seed: int) -> None:
    """The view's preemptible runs per (queue, rank), kept as work comes and goes (taken in bulk,
    admitted, finished, preempted), are those of `running`, with their compute, in id order; and a
    cycle's `VictimIndex` lists each group in the order of sorting (cost, rank, id) in full."""
    rng = random.Random(seed)
    snapshot, _ = cycle_latency.build(40, 0, seed)  # groups of more than 64 (lost work on arrays)
    view = ClusterView.from_snapshot(snapshot, classes=PriorityClasses())

    def check() -> None:
        expected: dict[tuple[str, Rank], list[Running]] = {}
        for run in view.running.values():
            if run.preemptible:
                expected.setdefault((run.cluster_queue, run.rank), []).append(run)
        kept = {(cq, rank): group
                for cq, ranks in view.victim_groups.items() for rank, group in ranks.items()}
        assert set(kept) == set(expected)
        for key, runs in expected.items():
            assert [r.workload.id for r in kept[key].by_id()] == sorted(r.workload.id for r in runs)
            assert kept[key].milli == sum(r.device_milli for r in runs)
        index = VictimIndex(view, 5000.0)
        for cq, rank in expected:
            full = sorted((lost_device_s(r, 5000.0), rank, r.workload.id, r) for r in expected[(cq, rank)])
            assert index._group(cq, rank).all() == full

    view.materialize()
    check()
    for step in range(30):
        ids = sorted(view.running)
        if step % 3 == 0 and ids:
            view.remove(rng.choice(ids))
        elif step % 3 == 1 and ids:
            run = view.running[rng.choice(ids)]
            view.detach(run)
            view.forget(run)
        else:
            w = cycle_latency._workload(900_000 + step, rng, 100.0)
            gang = place_gang(w, view.state, make_policy("first-fit"), rng)
            if not isinstance(gang, NoFit):
                view.admit(w, gang, "", 1000.0 + step)
        check()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1.0, 2.0, 3.5, 7.0]), st.integers(0, 10**6)),
                unique_by=lambda t: t[1]),
       st.integers(0, 40), st.integers(0, 10_000))
def test_corrected_ends_merge_in_as_heapq_merge_does(items: list, late: int, seed: int) -> None:
    rng = random.Random(seed)
    ends = sorted((end, f"w{i}") for end, i in items)
    milli = [rng.randrange(1, 9000) for _ in ends]
    late = min(late, len(ends))
    fixed = sorted((end + rng.choice([0.0, 0.5, 2.0, 9.0]), rid, m)
                   for (end, rid), m in zip(ends[:late], milli[:late], strict=True))
    merged, merged_milli = backfill._merge_in(ends, milli, late, fixed)
    by_id = dict(zip((rid for _, rid in ends), milli, strict=True))
    assert merged == list(heapq.merge([(e, r) for e, r, _ in fixed], ends[late:]))
    assert merged_milli == [by_id[rid] for _, rid in merged]
