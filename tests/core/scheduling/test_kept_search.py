"""A head's reservation search keeps what it computed from one cycle to the next (`backfill.KeptSearch`:
the runs released below the hint as sums, the overdue runs' corrected ends, the placements with the
shadow each read) and updates it from what changed; it must reserve exactly as a search made afresh,
whatever happened between two searches: runs started, ended, preempted and started again, started
again with a new estimate, and the clock passing planned and corrected ends."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
import test_admission_properties as props
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import cluster, pod, workload
from gpupool.core.model import PodRequest, Workload
from gpupool.core.scheduling import backfill
from gpupool.core.scheduling.backfill import KeptSearch, Reservation
from gpupool.core.scheduling.cycle import Policies, cycle_on
from gpupool.core.scheduling.policies.base import PlacementPolicy, make_policy
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.state import ClusterState

EASY = Policies(placement="first-fit", ordering="fifo", backfill=True)


def _state_key(state: ClusterState) -> tuple[object, ...]:
    arrays = (state.cpu_free, state.mem_free, state.dev_milli_free, state.dev_mem_free, state.node_version)
    kinds = [sorted(k.items()) for k in state.node_pod_kinds]
    return (*(a.tolist() for a in arrays), state.heavy_slices, kinds)


def _key(found: tuple[Reservation | None, float]) -> tuple[object, ...]:
    r, until = found
    if r is None:
        return (None, until)
    narrow = None if r.narrow is None else r.narrow.tolist()
    fits_on = None if r.fits_on is None else r.fits_on.tolist()
    return (r.start_s, until, fits_on, narrow, _state_key(r.shadow))


def _start(view: ClusterView, w: Workload, now: float, seed: int) -> None:
    cycle_on(view, [w], EASY, now, random.Random(seed))


def _new_run(rng: random.Random, k: int, now: float) -> Workload:
    shape = rng.choice([0.25, 0.5, 1, 1, 2, 4])
    pods = tuple(pod(shape) for _ in range(rng.choice([1, 1, 2, 3])))
    estimate = rng.choice([None, 20.0, 50.0, 100.0, 100.0, 200.0, 400.0])
    return replace(workload(*pods, wid=f"r{k}", submit_s=now), runtime_estimate_s=estimate)


def _step(view: ClusterView, rng: random.Random, k: int, now: float, policy: PlacementPolicy | None = None
          ) -> float:
    """One random change between two searches; returns the clock after it. `policy`: it may also be
    prepared again on another mix of pods (as `PolicyCache.tell` does when many pods arrived)."""
    what = rng.choice(["start", "start", "end", "time", "time", "restart", "estimate", "prepare"])
    running = sorted(view.running)
    if what == "prepare":
        if policy is not None:
            mix = [pod(rng.choice([0.25, 0.5, 1, 2, 4])) for _ in range(rng.choice([1, 3, 8]))]
            policy.prepare(view.state, mix)
            view.policies.prepare_count += 1
    elif what == "start" or not running:
        for j in range(rng.choice([1, 2, 3])):
            _start(view, _new_run(rng, k * 10 + j, now), now, k * 10 + j)
    elif what == "end":
        view.remove(rng.choice(running))
    elif what == "time":
        now += rng.choice([1.0, 10.0, 45.0, 120.0, 400.0])
    else:  # preempted and started again as it was, or with another estimate
        rid = rng.choice(running)
        w = view.running[rid].workload
        view.remove(rid)
        if what == "estimate":
            w = replace(w, runtime_estimate_s=rng.choice([None, 10.0, 60.0, 300.0, 900.0]))
        _start(view, w, now, k)
    return now


def _heads() -> list[Workload]:
    return [
        workload(pod(4), pod(4), wid="whole-nodes"),
        workload(pod(2), pod(2), pod(1), wid="gang"),
        workload(pod(3), wid="one"),
        workload(pod(0.5), pod(0.5), wid="shares"),
    ]


@pytest.mark.parametrize("shared", [False, True], ids=["per-head", "shared"])
@pytest.mark.parametrize("placement", ["first-fit", "best-fit", "fgd-strand", "gpu-clustering"])
@pytest.mark.parametrize("seed", range(8))
def test_the_kept_search_reserves_as_a_search_made_afresh(
    seed: int, placement: str, shared: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`shared`: one `KeptSearch` for every head, as a view keeps one per slot whatever its head."""
    rng = random.Random(seed)
    view = ClusterView.empty(cluster(5, devices=4))
    now = 0.0
    for k in range(12):
        _start(view, _new_run(rng, 1000 + k, now), now, k)
    policy = make_policy(placement)
    assert policy.is_repeatable()
    heads = _heads()
    one = KeptSearch.fresh(view.state)
    kept = {h.id: one if shared else KeptSearch.fresh(view.state) for h in heads}
    hints = dict.fromkeys(kept, float("inf"))
    compared = 0
    for k in range(60):
        now = _step(view, rng, k, now, policy)
        view.materialize()
        for head in heads:
            search = kept[head.id]
            incremental = backfill._reserve(head, view, now, policy, random.Random(k), hint_s=hints[head.id],
                                            kept=search)
            with monkeypatch.context() as mp:
                mp.setattr(backfill, "keep_corrected", False)
                afresh = backfill._reserve(head, view, now, policy, random.Random(k), hint_s=hints[head.id])
            assert _key(incremental) == _key(afresh), (k, head.id)
            if afresh[0] is not None:
                compared += 1
                hints[head.id] = afresh[0].start_s
    assert compared > 20


def test_each_kept_part_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kept sums, corrected ends and placements are reused between searches (so the comparison
    above compares reuse, not searches that happened to start afresh)."""
    counts = {"placed": 0, "tried": 0, "overdue_kept": 0, "overdue": 0, "released_again": 0, "released": 0}
    place_gang = backfill.place_gang
    overdue_kept = backfill._overdue_kept
    release_below = KeptSearch.release_below

    def placing(*args: object) -> object:
        counts["placed"] += 1
        return place_gang(*args)  # type: ignore[arg-type]

    def trying(*args: object) -> object:
        counts["tried"] += 1
        return place_at(*args)  # type: ignore[arg-type]

    def overdue(view: ClusterView, now_s: float, late: int, kept: KeptSearch) -> object:
        last = kept.overdue
        found = overdue_kept(view, now_s, late, kept)
        counts["overdue"] += 1
        counts["overdue_kept"] += last is not None and found is last[4]
        return found

    def releasing(self: KeptSearch, shadow: ClusterState, ends: list, running: dict, before: int) -> None:
        old = dict(self.released)
        release_below(self, shadow, ends, running, before)
        counts["released"] += len(self.released)
        counts["released_again"] += sum(1 for rid, run in self.released.items() if old.get(rid) is run)

    place_at = backfill._place_at
    monkeypatch.setattr(backfill, "place_gang", placing)
    monkeypatch.setattr(backfill, "_place_at", trying)
    monkeypatch.setattr(backfill, "_overdue_kept", overdue)
    monkeypatch.setattr(KeptSearch, "release_below", releasing)
    monkeypatch.setattr(backfill, "keep_expected", False)  # (its reuse: test_expected_ends.py)
    policy = make_policy("first-fit")
    for seed in range(8):
        rng = random.Random(seed)
        view = ClusterView.empty(cluster(5, devices=4))
        now = 0.0
        for k in range(12):
            _start(view, _new_run(rng, 1000 + k, now), now, k)
        head = _heads()[seed % 2]
        search = KeptSearch.fresh(view.state)
        hint = float("inf")
        for k in range(60):
            now = _step(view, rng, k, now)
            found, _ = backfill._reserve(head, view, now, policy, random.Random(k), hint_s=hint, kept=search)
            if found is not None:
                hint = found.start_s
    assert counts["placed"] < counts["tried"]
    assert counts["overdue_kept"] > 0
    assert counts["released_again"] > counts["released"] // 2, counts


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(props.ops, props.narrow_ops),
    st.sampled_from(["fifo", "priority-fifo", "drf", "las"]),
    st.sampled_from(["first-fit", "fgd-strand", "best-fit", "random", "fgd-plan"]),
    st.booleans(),
)
def test_whole_cycles_decide_as_with_searches_made_afresh(
    sequence: list, ordering: str, placement: str, preemption: bool
) -> None:
    """Whole cycles (admissions, preemptions, every rejection, the reservation) are the same with the
    kept searches as with every search made afresh (and no reservation kept whole either, so every
    cycle's search runs)."""
    policies = replace(props.BASE, ordering=ordering, placement=placement, preemption=preemption,
                       backfill=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backfill, "keep_reservations", False)
        kept = props._drive(sequence, policies, seed=11)
        mp.setattr(backfill, "keep_searches", False)
        fresh = props._drive(sequence, policies, seed=11)
    assert kept == fresh


def test_a_search_on_another_pool_starts_afresh() -> None:
    """The sums are of one pool's nodes: a view on other nodes gets a fresh `KeptSearch`."""
    view = ClusterView.empty(cluster(2, devices=4))
    search = KeptSearch.fresh(view.state)
    other = ClusterView.empty(cluster(2, devices=4))
    assert search.fits(view.state)
    assert not search.fits(other.state)
    assert np.array_equal(search.sums.dev_milli_free, np.zeros_like(view.state.dev_milli_free))


def test_corrected_ends_are_not_kept_for_another_record_of_the_same_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An overdue run's record replaced by another of the same id, planned end and compute (a
    re-synced allocation that started at another time, with another estimate) gets its own
    corrected end: the kept list is of the records, not of their ids."""
    view = ClusterView.empty(cluster(2, devices=4))
    _start(view, replace(workload(pod(1), wid="a"), runtime_estimate_s=100.0), 0.0, 0)
    search = KeptSearch.fresh(view.state)
    first = backfill._expected_ends(view, 150.0, True, search)
    assert first[2] == 200.0  # 100 s overdue at 150 s: doubled, it ends at 200 s
    run = view.running["a"]
    other = replace(run, start_time_s=50.0, estimate_s=50.0)  # planned to end at 100 s too
    assert other.planned_end_s == run.planned_end_s
    view.running["a"] = other
    with monkeypatch.context() as mp:
        mp.setattr(backfill, "keep_corrected", False)
        afresh = backfill._expected_ends(view, 150.0, True)
    assert afresh[2] == 250.0
    assert backfill._expected_ends(view, 150.0, True, search) == afresh


def _held(state: ClusterState, on_node: list[list[PodRequest]]) -> ClusterState:
    for node, pods in enumerate(on_node):
        at = 0
        for p in pods:
            state.allocate(state.make_alloc(p, node, range(at, at + p.num_devices)))
            at += p.num_devices
    return state


def test_a_placement_is_made_again_on_a_shadow_with_other_pods_in_the_same_room() -> None:
    """Two shadows with the same free amounts everywhere but other pods (one pod of two devices
    against two of one): a policy that reads the pods per node (gpu-clustering puts a pod beside
    pods of its kind) places the head elsewhere, so the answer on one is not reused for the other."""
    two = pod(2, cpu_milli=2000, memory_mib=2048)
    one = pod(1, cpu_milli=1000, memory_mib=1024)
    nodes = cluster(2, devices=4)
    a = _held(ClusterState(nodes), [[two], [one, one]])
    b = _held(ClusterState(a.nodes), [[one, one], [two]])
    b.dev_model = a.dev_model  # copies of one pool's state share these (`clone_state`)
    b.dev_mem_size = a.dev_mem_size
    assert all(np.array_equal(x, y) for x, y in zip(backfill._arrays(a), backfill._arrays(b), strict=True))
    policy = make_policy("gpu-clustering")
    head = workload(pod(1), wid="head")
    tried: list = []
    on_a = backfill._place_at(head, a, policy, random.Random(0), ([], tried))
    on_b = backfill._place_at(head, b, policy, random.Random(0), (tried, []))
    afresh_b = backfill._place_at(head, b, policy, random.Random(0), None)
    assert on_a is not None and on_b is not None and afresh_b is not None
    assert on_a.tolist() == [False, True]
    assert on_b.tolist() == afresh_b.tolist() == [True, False]


def test_corrected_ends_are_not_kept_when_the_clock_goes_back() -> None:
    """A live pool's clock may step back: the list kept at a later time is not used before it."""
    view = ClusterView.empty(cluster(2, devices=4))
    _start(view, replace(workload(pod(1), wid="a"), runtime_estimate_s=100.0), 0.0, 0)
    search = KeptSearch.fresh(view.state)
    assert backfill._expected_ends(view, 250.0, True, search)[2] == 400.0
    assert backfill._expected_ends(view, 150.0, True, search)[2] == 200.0
