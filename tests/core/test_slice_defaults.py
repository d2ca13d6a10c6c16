"""Default slice resources: proportional device memory and the node's per-device cpu and memory."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import node, pod, workload
from gpupool.config import parse_config
from gpupool.core.model import (
    NO_DEFAULTS,
    UNKNOWN_MEMORY_MIB,
    Allocation,
    ClusterSnapshot,
    Node,
    PodPlacement,
    PodRequest,
    Reason,
    SliceDefaults,
    Workload,
)
from gpupool.core.scheduling.cycle import Admit, CycleResult, Policies, cycle_on, run_cycle
from gpupool.core.scheduling.gang import place_gang, release_gang
from gpupool.core.scheduling.keeper import ViewKeeper
from gpupool.core.scheduling.policies.base import NoFit, make_policy
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.state import (
    ClusterState,
    PodAlloc,
    allocate_many,
    allocate_placements,
    clone_state,
    release_many,
)

GIB = 1024
FF = Policies(placement="first-fit")


def _bare(gpus: float, **kwargs: int) -> PodRequest:
    """A pod that names no cpu, memory or device memory unless told."""
    return pod(gpus, cpu_milli=kwargs.pop("cpu_milli", 0), memory_mib=kwargs.pop("memory_mib", 0), **kwargs)


def _cycle(nodes: list[Node], pending: list[Workload], policies: Policies = FF) -> CycleResult:
    return run_cycle(ClusterSnapshot(tuple(nodes)), pending, policies, 0.0, random.Random(0))


def _held(admission: Admit) -> tuple[int, int, tuple[int, ...]]:
    placement = admission.placements[0]
    return placement.cpu_milli, placement.memory_mib, tuple(s.memory_mib for s in placement.slices)


def _free(state: ClusterState) -> list[list[int]]:
    return [a.tolist() for a in (state.cpu_free, state.mem_free, state.dev_milli_free, state.dev_mem_free)]


# ------------------------------------------------------------------ device memory


def test_four_quarter_slices_each_hold_a_quarter_of_the_device_memory() -> None:
    nodes = [node("a", devices=1, device_memory_mib=80 * GIB)]
    result = _cycle(nodes, [workload(_bare(0.25), wid=f"w{i}") for i in range(4)])
    assert len(result.admitted) == 4
    assert {_held(a)[2] for a in result.admitted} == {(20 * GIB,)}


def test_an_explicit_request_does_not_fit_beside_default_slices() -> None:
    nodes = [node("a", devices=1, device_memory_mib=80 * GIB)]
    three = [workload(_bare(0.25), wid=f"w{i}", submit_s=i) for i in range(3)]
    big = workload(_bare(0.25, device_memory_mib=30 * GIB), wid="big", submit_s=9)
    result = _cycle(nodes, [*three, big])
    assert [a.workload_id for a in result.admitted] == ["w0", "w1", "w2"]  # 20 GiB left, not 30
    refused = {r.workload_id: r.reason for r in result.rejected}
    assert refused == {"big": Reason.INSUFFICIENT_DEVICES}
    # Without the default, the three slices held no memory and the explicit one fitted (as before).
    none = replace(FF, defaults=replace(SliceDefaults(), proportional_device_memory=False))
    before = _cycle(nodes, [*three, big], none)
    assert len(before.admitted) == 4
    assert [_held(a)[2] for a in before.admitted] == [(0,), (0,), (0,), (30 * GIB,)]


def test_shares_that_fit_in_compute_fit_in_memory_on_an_odd_sized_device() -> None:
    nodes = [node("a", devices=1, device_memory_mib=81_559)]  # an H100 80GB as NVML reports it
    result = _cycle(nodes, [workload(_bare(0.25), wid=f"w{i}") for i in range(4)])
    assert len(result.admitted) == 4
    assert {_held(a)[2] for a in result.admitted} == {(81_559 // 4,)}


def test_devices_of_unknown_memory_give_no_default_memory() -> None:
    nodes = [node("a", devices=1, device_memory_mib=UNKNOWN_MEMORY_MIB)]
    result = _cycle(nodes, [workload(_bare(0.5), wid=f"w{i}") for i in range(2)])
    assert [_held(a)[2] for a in result.admitted] == [(0,), (0,)]


def test_a_mixed_pool_gets_the_share_of_each_device() -> None:
    small = node("small", devices=1, model="A100-40", device_memory_mib=40 * GIB)
    large = node("large", devices=1, model="A100-80", device_memory_mib=80 * GIB)
    ws = [workload(_bare(0.5), wid=f"w{i}", submit_s=i) for i in range(4)]
    result = _cycle([small, large], ws)
    held = sorted((a.placements[0].node, _held(a)[2]) for a in result.admitted)
    assert held == [
        ("large", (40 * GIB,)), ("large", (40 * GIB,)), ("small", (20 * GIB,)), ("small", (20 * GIB,)),
    ]


def test_whole_devices_keep_the_whole_device_memory() -> None:
    result = _cycle([node("a", devices=2, device_memory_mib=80 * GIB)], [workload(_bare(2), wid="w")])
    assert _held(result.admitted[0])[2] == (80 * GIB, 80 * GIB)


# ------------------------------------------------------------------ cpu and host memory


def test_node_share_of_cpu_and_memory_for_whole_and_fractional_pods() -> None:
    a = node("a", devices=8, cpu_milli=64_000, memory_mib=256 * GIB)
    result = _cycle([a], [workload(_bare(2), wid="whole"), workload(_bare(0.25), wid="part"),
                          workload(_bare(0), wid="cpu-only")])
    held = {adm.workload_id: _held(adm)[:2] for adm in result.admitted}
    assert held == {"whole": (16_000, 64 * GIB), "part": (2_000, 8 * GIB), "cpu-only": (0, 0)}


def test_a_named_amount_wins_over_the_default_one_by_one() -> None:
    a = node("a", devices=8, cpu_milli=64_000, memory_mib=256 * GIB)
    result = _cycle([a], [workload(_bare(1, cpu_milli=500), wid="w")])
    assert _held(result.admitted[0])[:2] == (500, 32 * GIB)


def test_node_share_refuses_a_pod_whose_share_is_taken() -> None:
    # Two devices, 8 cores: a cpu-hungry pod takes 6 cores, so the other device's 4-core share is gone.
    a = node("a", devices=2, cpu_milli=8_000, memory_mib=64 * GIB)
    hungry = workload(_bare(1, cpu_milli=6_000), wid="hungry", submit_s=0)
    result = _cycle([a], [hungry, workload(_bare(1), wid="plain", submit_s=1)])
    assert [adm.workload_id for adm in result.admitted] == ["hungry"]
    assert {r.workload_id: r.reason for r in result.rejected} == {"plain": Reason.INSUFFICIENT_CPU}


def test_configured_cpu_and_memory_per_gpu_override_the_node_share() -> None:
    config = parse_config("defaults:\n  cpu_per_gpu: 4\n  memory_per_gpu: 32GiB\n")
    policies = replace(config.policies(), placement="first-fit")
    assert policies.defaults == SliceDefaults(True, 4_000, 32 * GIB)
    a = node("a", devices=8, cpu_milli=64_000, memory_mib=512 * GIB)
    result = _cycle([a], [workload(_bare(1), wid="one"), workload(_bare(0.5), wid="half")], policies)
    held = {adm.workload_id: _held(adm)[:2] for adm in result.admitted}
    assert held == {"one": (4_000, 32 * GIB), "half": (2_000, 16 * GIB)}


def test_configuration_defaults_and_none() -> None:
    assert parse_config("").policies().defaults == SliceDefaults()
    none = parse_config("defaults: {gpu_memory: none}\n").policies().defaults
    assert none == SliceDefaults(proportional_device_memory=False)
    assert Policies().defaults == SliceDefaults()


# ------------------------------------------------------------------ rebuilding from what was recorded


def test_a_snapshot_of_the_admissions_rebuilds_exactly_what_the_cycle_took() -> None:
    nodes = [node("a", devices=4, cpu_milli=48_000, memory_mib=192 * GIB, device_memory_mib=80 * GIB)]
    ws = [
        workload(_bare(0.25), wid="q"), workload(_bare(2), wid="two"),
        workload(_bare(0.5, cpu_milli=700), wid="h"),
    ]
    view = ClusterView.empty(nodes)
    result = cycle_on(view, ws, FF, 0.0, random.Random(0))
    assert len(result.admitted) == 3
    by_id = {w.id: w for w in ws}
    allocations = tuple(Allocation(by_id[a.workload_id], a.placements) for a in result.admitted)
    snap = ClusterSnapshot(tuple(nodes), allocations)
    # The recorded amounts are used whatever the defaults now are.
    for defaults in (SliceDefaults(), NO_DEFAULTS, SliceDefaults(cpu_milli_per_device=1)):
        assert _free(ClusterView.from_snapshot(snap, defaults=defaults).state) == _free(view.state)
    for wid in ("q", "two", "h"):
        view.remove(wid)
    assert _free(view.state) == _free(ClusterState(nodes))


def test_the_keeper_holds_and_gives_back_the_recorded_amounts() -> None:
    nodes = [node("a", devices=2, cpu_milli=16_000, memory_mib=64 * GIB, device_memory_mib=80 * GIB)]
    ws = [workload(_bare(0.5), wid="x"), workload(_bare(1), wid="y")]
    keeper = ViewKeeper()
    first = keeper.cycle(ClusterSnapshot(tuple(nodes)), ws, FF, 0.0, random.Random(0))
    by_id = {w.id: w for w in ws}
    allocations = tuple(Allocation(by_id[a.workload_id], a.placements) for a in first.admitted)
    keeper.cycle(ClusterSnapshot(tuple(nodes), allocations), [], FF, 1.0, random.Random(0))
    assert keeper.view is not None
    taken = _free(keeper.view.state)
    assert taken[0] == [16_000 - 4_000 - 8_000] and taken[1] == [64 * GIB - 16 * GIB - 32 * GIB]
    keeper.cycle(ClusterSnapshot(tuple(nodes)), [], FF, 2.0, random.Random(0))  # both finished
    assert _free(keeper.view.state) == _free(ClusterState(nodes))
    assert keeper.rebuilds == 1


# ------------------------------------------------------------------ properties

_MEMORY = st.sampled_from([40 * GIB, 80 * GIB, 81_559, UNKNOWN_MEMORY_MIB])
_NODES = st.lists(
    st.builds(
        lambda devices, mem, cpu, host: (devices, mem, cpu, host),
        st.integers(1, 8), _MEMORY, st.integers(0, 128).map(lambda c: c * 1000 + 500), st.integers(1, 1024),
    ),
    min_size=1,
    max_size=4,
)
_POD = st.builds(
    lambda gpus, cpu, mem, dev_mem: (gpus, cpu, mem, dev_mem),
    st.sampled_from([0, 0.1, 0.25, 0.3, 0.5, 0.75, 1, 2, 4]),
    st.sampled_from([0, 0, 500, 4000]),
    st.sampled_from([0, 0, 1024, 16 * GIB]),
    st.sampled_from([0, 0, 0, 10 * GIB]),
)
_PODS = st.lists(_POD, min_size=1, max_size=24)
_DEFAULTS = st.sampled_from(
    [SliceDefaults(), NO_DEFAULTS, SliceDefaults(cpu_milli_per_device=3_000, memory_mib_per_device=20 * GIB),
     SliceDefaults(proportional_device_memory=False)]
)


def _pool(specs: list[tuple[int, int, int, int]]) -> list[Node]:
    return [
        node(f"n{i}", devices=d, model=f"m{mem}", device_memory_mib=mem, cpu_milli=cpu, memory_mib=host * GIB)
        for i, (d, mem, cpu, host) in enumerate(specs)
    ]


@settings(max_examples=120, deadline=None)
@given(_NODES, _PODS, _DEFAULTS, st.integers(0, 1000))
def test_take_then_release_restores_the_state_exactly(
    specs: list[tuple[int, int, int, int]], asks: list[tuple[float, int, int, int]], defaults: SliceDefaults,
    seed: int,
) -> None:
    """Placed with defaults, every record matches the scalar reference, nothing is over-allocated,
    a snapshot of the placements rebuilds the same state, and releasing all restores it exactly."""
    nodes = _pool(specs)
    state = ClusterState(nodes, defaults)
    empty = _free(state)
    policy = make_policy("best-fit")
    rng = random.Random(seed)
    placed = []
    for i, (gpus, cpu, mem, dev_mem) in enumerate(asks):
        p = _bare(gpus, cpu_milli=cpu, memory_mib=mem, device_memory_mib=dev_mem)
        w = workload(p, wid=f"w{i}")
        gang = place_gang(w, state, policy, rng)
        if isinstance(gang, NoFit):
            continue
        state.check_invariants()
        placed.append(gang)
        (placement,) = gang.placements(state)
        host = nodes[state.node_index[placement.node]]
        assert placement.cpu_milli == defaults.cpu_milli(p, host)
        assert placement.memory_mib == defaults.memory_mib(p, host)
        for s in placement.slices:
            assert s.memory_mib == defaults.device_memory_mib(p, host.devices[s.device_index])
    allocations = tuple(Allocation(g.workload, g.placements(state)) for g in placed)
    rebuilt = ClusterState.from_snapshot(ClusterSnapshot(tuple(nodes), allocations), NO_DEFAULTS)
    assert _free(rebuilt) == _free(state)
    rng.shuffle(placed)
    for gang in placed:
        release_gang(gang, state)
    assert _free(state) == empty


@settings(max_examples=80, deadline=None)
@given(_NODES, _PODS, _DEFAULTS)
def test_vectorised_fit_agrees_with_the_scalar_reference(
    specs: list[tuple[int, int, int, int]], asks: list[tuple[float, int, int, int]], defaults: SliceDefaults
) -> None:
    """On an empty pool, a pod fits a node exactly when the scalar amounts fit it there."""
    nodes = _pool(specs)
    state = ClusterState(nodes, defaults)
    for gpus, cpu, mem, dev_mem in asks:
        p = _bare(gpus, cpu_milli=cpu, memory_mib=mem, device_memory_mib=dev_mem)
        expected = []
        for n in nodes:
            host = defaults.cpu_milli(p, n) <= n.cpu_milli and defaults.memory_mib(p, n) <= n.memory_mib
            devices = sum(
                1 for d in n.devices
                if d.memory_mib == UNKNOWN_MEMORY_MIB or defaults.device_memory_mib(p, d) <= d.memory_mib
            )
            expected.append(host and devices >= p.num_devices)
        assert state.node_fits(p).tolist() == expected
        assert state.node_fits_at(p, range(len(nodes))) == any(expected)
        hosts = [defaults.cpu_milli(p, n) <= n.cpu_milli and defaults.memory_mib(p, n) <= n.memory_mib
                 for n in nodes]
        assert np.array_equal(state.host_fits(p), hosts)


def _brute_device_fits(state: ClusterState, p: PodRequest) -> np.ndarray:
    """device_fits without the skip: compute and the proportional memory checked on every device."""
    need = state.device_memory_need(p)
    return (state.dev_milli_free >= p.device_milli) & (state.dev_mem_free >= need) & state.dev_valid


def _heavy_count(state: ClusterState, records: list[PodAlloc]) -> int:
    size = state.dev_mem_size
    return sum(
        1 for r in records for d, m, mem in zip(r.devices, r.device_milli, r.device_memory_mib, strict=True)
        if m < 1000 and size[r.node, d] and mem > size[r.node, d] * m // 1000
    )


@settings(max_examples=100, deadline=None)
@given(_NODES, st.lists(_POD, min_size=1, max_size=40), st.integers(0, 1000))
def test_skipping_the_memory_check_never_changes_a_fit(
    specs: list[tuple[int, int, int, int]], asks: list[tuple[float, int, int, int]], seed: int
) -> None:
    """While no placed share holds more memory than its compute's share the memory comparison is
    skipped; with shares that do (explicit memory), it runs. Either way a default share's fit is
    exactly the full check, after placements and releases, one by one or in bulk (records or a
    snapshot's placements)."""
    nodes = _pool(specs)
    state = ClusterState(nodes, SliceDefaults())
    rng = random.Random(seed)
    records: list[PodAlloc] = []
    allocations = []
    probes = [_bare(m / 1000) for m in (100, 250, 500, 750)]
    for i, (gpus, cpu, mem, dev_mem) in enumerate(asks):
        p = _bare(gpus, cpu_milli=cpu, memory_mib=mem, device_memory_mib=dev_mem)
        fits = np.flatnonzero(state.node_fits(p))
        if not fits.size:
            continue
        n = int(fits[rng.randrange(fits.size)])
        record = state.make_alloc(p, n, np.flatnonzero(state.device_fits(p)[n])[: p.num_devices])
        state.allocate(record)
        records.append(record)
        placement = PodPlacement(p.name, nodes[n].name, record.slices(), record.cpu_milli, record.memory_mib)
        allocations.append(Allocation(Workload(f"w{i}", (p,)), (placement,)))
        for probe in probes:
            assert np.array_equal(state.device_fits(probe), _brute_device_fits(state, probe))
    assert state.heavy_slices == _heavy_count(state, records)
    in_bulk = ClusterState(nodes, SliceDefaults())
    allocate_many(in_bulk, records)
    from_snapshot = ClusterState(nodes, SliceDefaults())
    allocate_placements(from_snapshot, allocations)
    assert in_bulk.heavy_slices == from_snapshot.heavy_slices == state.heavy_slices
    order = list(range(len(records)))
    rng.shuffle(order)
    gone = [records[k] for k in order[: len(order) // 2]]
    release_many(in_bulk, gone)
    for record in gone:
        state.release(record)
    kept = [records[k] for k in order[len(order) // 2:]]
    assert in_bulk.heavy_slices == state.heavy_slices == _heavy_count(state, kept)
    for probe in probes:
        assert np.array_equal(state.device_fits(probe), _brute_device_fits(state, probe))
    assert clone_state(state).heavy_slices == state.heavy_slices
    assert clone_state(state, empty=True).heavy_slices == 0


def test_an_explicit_heavy_share_turns_the_memory_check_on() -> None:
    state = ClusterState([node("a", devices=1, device_memory_mib=80 * GIB)], SliceDefaults())
    heavy = _bare(0.25, device_memory_mib=70 * GIB)
    state.allocate(state.make_alloc(heavy, 0, [0]))
    assert state.heavy_slices == 1
    assert state.device_fits(_bare(0.25)).tolist() == [[False]]  # 250 milli free in compute, 10 GiB in memory
    assert state.device_fits(_bare(0.1)).tolist() == [[True]]
