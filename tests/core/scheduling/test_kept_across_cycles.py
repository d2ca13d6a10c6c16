"""What a view keeps across cycles (the backfill reservation, the pending queue's counts and
verdicts) decides exactly as computing it afresh on every cycle."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Literal

import pytest
import test_admission_properties as props
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import cluster
from gpupool.core.model import PodRequest, Workload
from gpupool.core.priority import PriorityClasses
from gpupool.core.scheduling import backfill, cycle
from gpupool.core.scheduling.cycle import Policies, cycle_on
from gpupool.core.scheduling.gang import place_gang, release_gang
from gpupool.core.scheduling.ordering.base import OrderingContext, demand_of
from gpupool.core.scheduling.ordering.drf import Drf, dominant_share
from gpupool.core.scheduling.policies.base import NoFit, make_policy
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.state import clone_state, release_many


def _fresh_reservations(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(backfill, "keep_reservations", False)


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(props.ops, props.narrow_ops),
    st.sampled_from(["fifo", "priority-fifo", "drf", "las"]),
    st.sampled_from(["first-fit", "fgd-strand", "best-fit", "random", "fgd-plan"]),
    st.booleans(),
)
def test_kept_reservation_decides_as_reserving_afresh(
    sequence: list, ordering: str, placement: str, preemption: bool
) -> None:
    """Whole cycles (admissions, preemptions, every rejection, the reservation) are the same."""
    policies = replace(
        props.BASE, ordering=ordering, placement=placement, preemption=preemption, backfill=True
    )
    kept = props._drive(sequence, policies, seed=11)
    with pytest.MonkeyPatch.context() as mp:
        _fresh_reservations(mp)
        fresh = props._drive(sequence, policies, seed=11)
    assert kept == fresh


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(props.ops, props.narrow_ops),
    st.sampled_from(["fifo", "priority-fifo", "drf", "las"]),
    st.sampled_from(["first-fit", "fgd-strand", "best-fit", "fgd-plan"]),
)
def test_refusing_a_refused_key_again_decides_as_placing_it(
    sequence: list, ordering: str, placement: str
) -> None:
    """Whole cycles are the same whether work the reservation refused a moment ago for its key is
    refused again at once or placed and checked against the shadow again."""
    policies = replace(props.BASE, ordering=ordering, placement=placement, backfill=True)
    kept = props._drive(sequence, policies, seed=5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle._Cycle, "keep_refusals", False)
        fresh = props._drive(sequence, policies, seed=5)
    assert kept == fresh


def _job(i: int, pods: int, estimate_s: float | None, submit_s: float) -> Workload:
    return Workload(
        id=f"w{i}",
        pods=tuple(PodRequest(f"p{k}", cpu_milli=100, num_devices=4 if pods else 1, device_milli=1000)
                   for k in range(max(pods, 1))),
        submit_time_s=submit_s,
        runtime_estimate_s=estimate_s,
    )


def _stuck_head_cycles(head_pods: int, nows: list[float]) -> tuple[list, int]:  # type: ignore[type-arg]
    """A full pool (two 4-device nodes: one ends at 100, one at 30 by estimate) and a stuck head of
    `head_pods` 4-device pods; a one-device arrival that may not backfill each cycle, at `nows`."""
    calls = 0
    original = backfill._reserve

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return original(*args, **kwargs)

    view = ClusterView.empty(cluster(2, devices=4))
    policies = Policies(placement="first-fit", ordering="fifo", backfill=True)
    pending = [_job(0, 1, 100.0, 0.0), _job(1, 1, 30.0, 0.0)]
    results = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backfill, "_reserve", counting)
        assert len(cycle_on(view, pending, policies, 0.0, random.Random(1)).admitted) == 2
        pending = [_job(2, head_pods, 50.0, 1.0)]
        for k, now in enumerate(nows):
            pending.append(_job(10 + k, 0, 500.0, now))  # would delay the head: never backfills
            results.append(cycle_on(view, list(pending), policies, now, random.Random(k)))
    return results, calls


NOWS = [5.0, 10.0, 20.0, 40.0, 60.0, 80.0]


@pytest.mark.parametrize(
    ("head_pods", "starts"),
    [
        (2, [100.0, 100.0, 100.0, 100.0, 120.0, 120.0]),  # both nodes: the later of the two ends
        (1, [30.0, 30.0, 30.0, 60.0, 100.0, 100.0]),  # one node: the earlier of the two ends
    ],
)
def test_a_stuck_head_reuses_its_reservation_until_an_estimated_end_passes(
    head_pods: int, starts: list[float]
) -> None:
    """Computed once while no estimated end passes (5, 10, 20); again when one does (40: the run
    due at 30 is then expected at 60, its estimate doubled), and when that correction is reached
    (60: now expected at 120); kept at 80 (nothing passed since); the same as afresh each time."""
    kept, calls = _stuck_head_cycles(head_pods, NOWS)
    with pytest.MonkeyPatch.context() as mp:
        _fresh_reservations(mp)
        fresh, fresh_calls = _stuck_head_cycles(head_pods, NOWS)
    assert kept == fresh
    assert [r.reservation.start_s if r.reservation else None for r in kept] == starts
    assert [r.reservation.workload_id if r.reservation else None for r in kept] == ["w2"] * len(NOWS)
    assert fresh_calls == len(NOWS)
    assert calls == 3


def _reserve_by_sorting(head: Workload, view: ClusterView, now_s: float, rng: random.Random,  # type: ignore[no-untyped-def]
                        correct: bool):
    """The definition `reserve` had before it read the view's kept order of ends: sort every run
    with an estimate by (expected end, id), release them in that order, one end time at a time.
    The expected end: the corrected one (`corrected_end_s`), or now for an overdue run."""
    def end(run):  # type: ignore[no-untyped-def]
        return backfill.corrected_end_s(run, now_s) if correct else run.expected_end_s(now_s)

    runs = sorted((end(run), rid, run) for rid, run in view.running.items() if run.estimate_s is not None)
    shadow = clone_state(view.state)
    policy = make_policy("first-fit")
    for k, (t, _, run) in enumerate(runs):
        release_many(shadow, [rec for _, rec in run.allocs])
        if k + 1 < len(runs) and runs[k + 1][0] == t:
            continue
        gang = place_gang(head, shadow, policy, rng)
        if not isinstance(gang, NoFit):
            release_gang(gang, shadow)
            return t, shadow
    return None


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 4), st.sampled_from([None, 10.0, 20.0, 35.0, 60.0])), max_size=12),
    st.integers(1, 8),
    st.sampled_from([0.0, 10.0, 20.0, 30.0, 50.0, 75.0]),
    st.booleans(),
)
def test_reserve_releases_runs_by_end_as_sorting_them_does(
    runs: list, head_devices: int, now: float, correct: bool
) -> None:
    """Runs of random sizes and estimates (some past, some equal, some none): the same start and
    shadow state as sorting every run by its expected end (the skip-ahead and trial cap aside),
    overdue ends corrected or not."""
    view = ClusterView.empty(cluster(2, devices=4))
    policy = make_policy("first-fit")
    for i, (devices, estimate) in enumerate(runs):
        w = _job(100 + i, 0, estimate, 0.0)
        w = replace(w, pods=(replace(w.pods[0], num_devices=devices),))
        gang = place_gang(w, view.state, policy, random.Random(0))
        if not isinstance(gang, NoFit):
            view.admit(w, gang, "", 0.0)
    head = _job(1, 0, 5.0, 0.0)
    pod = replace(head.pods[0], num_devices=min(head_devices, 4))
    head = replace(head, pods=tuple(replace(pod, name=f"p{k}") for k in range(1 + head_devices // 5)))
    found = backfill.reserve(head, view, now, policy, random.Random(0), correct=correct)
    expected = _reserve_by_sorting(head, view, now, random.Random(0), correct)
    if expected is None:
        assert found is None
        return
    assert found is not None
    assert found.start_s == expected[0]
    for name in ("cpu_free", "mem_free", "dev_milli_free", "dev_mem_free"):
        assert (getattr(found.shadow, name) == getattr(expected[1], name)).all()
    assert found.shadow.node_pod_kinds == expected[1].node_pod_kinds


# ---------------------------------------------------------------- the pending book

mixed_job = st.tuples(
    st.sampled_from(["a", "b", "c", "nobody"]),  # "nobody": a tenant whose queue feeds no ClusterQueue
    st.sampled_from([*props.CLASSES, "unknown"]),
    st.sampled_from([(1, 300), (1, 1000), (2, 1000)]),
    st.integers(min_value=1, max_value=2),
    st.floats(min_value=1, max_value=50),
)
steps = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "finish", "resubmit", "shuffle", "leave"]),
        mixed_job,
    ),
    min_size=1,
    max_size=30,
)


def _drive_mixed(sequence: list, policies: Policies, seed: int) -> list:  # type: ignore[type-arg]
    """Arrivals and completions as in test_admission_properties, and what a caller may also do: list
    the same workloads in another order, withdraw a waiting workload, submit an id again with other
    contents; workloads of unknown classes and queues stay listed."""
    view = ClusterView.empty(cluster(2, devices=4), policies.quota, policies.priority_classes)
    rng = random.Random(seed)
    order = random.Random(seed + 1)
    pending: dict[str, Workload] = {}
    results = []
    for step, (op, spec) in enumerate(sequence):
        now = float(step * 5)
        listed = list(pending.values())
        if op == "finish" and view.running:
            view.remove(sorted(view.running)[rng.randrange(len(view.running))])
        elif op == "resubmit" and pending:
            old = sorted(pending)[order.randrange(len(pending))]
            pending[old] = replace(props._workload(step, spec, now), id=old)
            listed = list(pending.values())
        elif op == "leave" and pending:
            del pending[sorted(pending)[order.randrange(len(pending))]]
            listed = list(pending.values())
        w = props._workload(step, spec, now)
        pending[w.id] = w
        listed = [x for x in listed if x.id in pending and pending[x.id] is x] + [w]
        if op == "shuffle":
            order.shuffle(listed)
        running = {wid: r.workload for wid, r in view.running.items()}
        result = cycle_on(view, listed, policies, now, rng)
        for stop in result.preempted:
            pending[stop.workload_id] = running[stop.workload_id]
        for admission in result.admitted:
            pending.pop(admission.workload_id, None)
        results.append(result)
    return results


@settings(max_examples=80, deadline=None)
@given(
    steps,
    st.sampled_from(["fifo", "priority-fifo", "drf", "las"]),
    st.booleans(),
    st.booleans(),
)
def test_pending_book_decides_as_looking_every_workload_up(
    sequence: list, ordering: str, preemption: bool, backfill_on: bool
) -> None:
    """Whole cycles, rejections in order included, with the book and without it."""
    policies = replace(props.BASE, ordering=ordering, preemption=preemption, backfill=backfill_on)
    kept = _drive_mixed(sequence, policies, seed=13)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle._Cycle, "keep_pending", False)
        plain = _drive_mixed(sequence, policies, seed=13)
    assert kept == plain


def test_a_list_naming_one_object_twice_empties_the_book_and_is_nominated_plainly() -> None:
    view = ClusterView.empty(cluster(1, devices=4))
    w, v = _job(1, 0, None, 0.0), _job(2, 0, None, 0.0)
    book = view.pending_book
    assert book.update([w, v], lambda x: view.meta(x, None)) == [w, v]
    assert book.update([v, w, v], lambda x: view.meta(x, None)) is None
    assert not book.objs and not book.counts
    assert book.update([v, w], lambda x: view.meta(x, None)) == [v, w]
    assert sum(book.counts.values()) == 2


# ---------------------------------------------------------------- DRF's kept queue


def _drf_plain(pending: list, ctx: OrderingContext, skips: set[int]) -> list:  # type: ignore[type-arg]
    """DRF's definition, one workload at a time: sort every workload by (-class value, tenant,
    -priority, submit time, id); band by band, the tenant with the smallest weighted dominant share
    goes next and its usage grows by each one's demand; at the positions in `skips` the rest of the
    band is passed over (its demand still counted). Returns the order, passed-over ones included."""
    keyed = sorted((-ctx.rank(w)[0], w.tenant, -ctx.rank(w)[1], w.submit_time_s, w.id, w) for w in pending)
    usage = {t: dict(u) for t, u in ctx.tenant_usage.items()}
    out: list = []  # type: ignore[type-arg]
    for band in sorted({k[0] for k in keyed}):
        queues: dict[str, list] = {}  # type: ignore[type-arg]
        for k in keyed:
            if k[0] == band:
                queues.setdefault(k[1], []).append(k[5])
        while any(queues.values()):
            tenant = min((t for t, q in queues.items() if q),
                         key=lambda t: (dominant_share(usage.setdefault(t, {}), ctx, t), t))
            w = queues[tenant].pop(0)
            out.append(w)
            for r, a in demand_of(w).items():
                usage[tenant][r] = usage[tenant].get(r, 0.0) + a
            if len(out) in skips:
                for t, q in queues.items():
                    for v in q:
                        out.append(v)
                        for r, a in demand_of(v).items():
                            usage[t][r] = usage[t].get(r, 0.0) + a
                    q.clear()
    return out


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(["high", "normal", "low"]),
                                st.integers(0, 3), st.integers(1, 4), st.booleans()), max_size=8),
             min_size=1, max_size=6),
    st.sets(st.integers(1, 30)),
    st.dictionaries(st.sampled_from("abc"), st.integers(0, 8)),
)
def test_drf_stream_from_the_kept_queue_is_the_definition(rounds: list, skips: set[int], held: dict) -> None:
    """Rounds of arrivals and departures on one memo; each round's stream (skipping the rest of a
    band at `skips`) gives what sorting and filling afresh gives, skipped workloads included."""
    classes = PriorityClasses()
    memo: dict = {}  # type: ignore[type-arg]
    pending: dict[str, Workload] = {}
    serial = 0
    for arrivals in rounds:
        for tenant, klass, submit, devices, leave in arrivals:
            if leave and pending:
                del pending[sorted(pending)[serial % len(pending)]]
            serial += 1
            pending[f"w{serial}"] = Workload(
                id=f"w{serial}", tenant=tenant, priority_class=klass, submit_time_s=float(submit),
                pods=(PodRequest("p", cpu_milli=1000 * devices, num_devices=devices, device_milli=1000),))
        listed = list(pending.values())
        ctx = OrderingContext(
            now_s=0.0, rank=classes.rank, capacity={"device_milli": 16_000.0, "cpu_milli": 64_000.0},
            tenant_usage={t: {"device_milli": 1000.0 * n, "cpu_milli": 500.0 * n} for t, n in held.items()},
            tenant_weights={"b": 2.0}, memo=memo,
        )
        stream = Drf().stream(listed, ctx)
        out: list = []  # type: ignore[type-arg]
        while (w := stream.next_workload()) is not None:
            out.append(w)
            if len(out) in skips:
                out.extend(stream.skip_band())
        assert [w.id for w in out] == [w.id for w in _drf_plain(listed, ctx, skips)]


def test_drf_follows_the_pending_books_changes_and_compares_lists_when_it_missed_some() -> None:
    view = ClusterView.empty(cluster(1, devices=1))
    policies = Policies(placement="first-fit", ordering="drf")
    waiting = [_job(i, 0, None, float(i)) for i in range(4)]
    for k in range(3):  # the pool holds one: the rest waits, one more arrives each cycle
        cycle_on(view, waiting[: 2 + k], policies, float(k), random.Random(k))
        book = view.ordering_memo["drf"]["book"]
        assert book.serial == view.pending_book.serial  # moved by the book's changes
    cycle_on(view, waiting, replace(policies, ordering="fifo"), 3.0, random.Random(3))
    listed = [w for w in waiting if w.id not in view.running]
    cycle_on(view, listed, policies, 4.0, random.Random(4))  # one list missed: compared whole
    assert sorted(w.id for q in book.bands[0].values() for w in q.workloads) == sorted(w.id for w in listed)
    assert book.serial == view.pending_book.serial


@pytest.mark.parametrize("slot", ["kept_reservation", "kept_leaf_reservation"])
def test_a_kept_reservation_is_reused_only_for_the_same_earliest_start(
    slot: Literal["kept_reservation", "kept_leaf_reservation"],
) -> None:
    """A reservation kept for one `not_before_s` is not handed back for another: asked again with
    a later bound, the head is reserved at the first end time at or after it, as afresh."""
    view = ClusterView.empty(cluster(2, devices=4))
    policy = make_policy("first-fit")
    running = [_job(0, 1, 100.0, 0.0), _job(1, 1, 30.0, 0.0)]
    fifo = Policies(placement="first-fit", ordering="fifo")
    assert len(cycle_on(view, running, fifo, 0.0, random.Random(1)).admitted) == 2
    head = _job(2, 1, 50.0, 1.0)
    first = backfill.kept_reserve(head, view, 1.0, policy, random.Random(0), slot=slot)
    assert first is not None and first.start_s == 30.0
    again = backfill.kept_reserve(head, view, 1.0, policy, random.Random(0), slot=slot)
    assert again is not None and again.start_s == 30.0
    later = backfill.kept_reserve(head, view, 1.0, policy, random.Random(0), slot=slot, not_before_s=31.0)
    assert later is not None and later.start_s == 100.0
    assert getattr(view, slot).not_before_s == 31.0
