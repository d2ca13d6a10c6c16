"""Every placement policy on small hand-made clusters whose best answer is known."""

from __future__ import annotations

import random

import pytest

from factories import POLICY_NAMES, node, pod
from gpupool.core.model import Reason
from gpupool.core.scheduling.policies import fgd_strand
from gpupool.core.scheduling.policies.base import Choice, NoFit, make_policy, policy_names
from gpupool.core.scheduling.policies.fgd_strand import model_pressure
from gpupool.core.state import ClusterState, clone_state

ALL = list(POLICY_NAMES)


def place(state: ClusterState, name: str, p, seed: int = 0, **options) -> Choice:
    policy = make_policy(name, **options)
    choice = policy.place(p, state, random.Random(seed))
    assert isinstance(choice, Choice), choice
    return choice


def take(state: ClusterState, p, node_index: int, devices: tuple[int, ...]) -> None:
    state.allocate(state.make_alloc(p, node_index, devices))


def two_nodes_one_busy() -> ClusterState:
    """n0: 4 empty devices; n1: 4 devices, three taken whole and device 3 half used."""
    state = ClusterState([node("n0", devices=4), node("n1", devices=4)])
    take(state, pod(3), 1, (0, 1, 2))
    take(state, pod(0.5), 1, (3,))
    return state


def test_every_policy_is_registered() -> None:
    assert set(ALL) == set(policy_names())  # a new policy joins POLICY_NAMES and every test here


@pytest.mark.parametrize("name", ALL)
def test_nofit_when_nothing_fits(name: str) -> None:
    state = ClusterState([node("n0", devices=2)])
    result = make_policy(name).place(pod(4), state, random.Random(0))
    assert isinstance(result, NoFit)
    assert result.reason == Reason.INSUFFICIENT_DEVICES


@pytest.mark.parametrize("name", ALL)
def test_choice_fits_and_allocates(name: str) -> None:
    state = two_nodes_one_busy()
    for p in (pod(0.3), pod(1), pod(0), pod(2)):
        choice = place(state, name, p)
        take(state, p, choice.node, choice.devices)
    state.check_invariants()


def test_first_fit_takes_the_first_node() -> None:
    assert place(two_nodes_one_busy(), "first-fit", pod(0.25)).node == 0


def test_best_fit_takes_the_fullest_node_and_tightest_device() -> None:
    state = two_nodes_one_busy()
    assert place(state, "best-fit", pod(0.25)) == Choice(1, (3,))


def test_worst_fit_takes_the_emptiest_node() -> None:
    assert place(two_nodes_one_busy(), "worst-fit", pod(0.25)).node == 0


def test_dot_product_prefers_least_aligned_free_capacity() -> None:
    assert place(two_nodes_one_busy(), "dot-product", pod(0.25)) == Choice(1, (3,))


def test_gpu_packing_shares_a_used_device_first() -> None:
    assert place(two_nodes_one_busy(), "gpu-packing", pod(0.25)) == Choice(1, (3,))


def test_gpu_packing_prefers_free_devices_of_a_used_node_over_an_empty_node() -> None:
    state = ClusterState([node("n0", devices=4), node("n1", devices=4)])
    take(state, pod(1), 1, (0,))
    assert place(state, "gpu-packing", pod(1)).node == 1


def test_gpu_clustering_puts_like_with_like() -> None:
    state = ClusterState([node("n0", devices=4), node("n1", devices=4), node("n2", devices=4)])
    take(state, pod(2), 0, (0, 1))
    take(state, pod(0.5), 1, (0,))
    assert place(state, "gpu-clustering", pod(0.2)).node == 1
    assert place(state, "gpu-clustering", pod(2)).node == 0
    assert place(state, "gpu-clustering", pod(4)).node == 2


def test_random_is_seeded_and_covers_the_feasible_nodes() -> None:
    state = ClusterState([node(f"n{i}", devices=2) for i in range(4)])
    picks = [place(state, "random", pod(1), seed=s).node for s in range(40)]
    assert picks == [place(state, "random", pod(1), seed=s).node for s in range(40)]
    assert set(picks) == {0, 1, 2, 3}


def fgd_state() -> tuple[ClusterState, list]:
    """n0 two free devices; n1 one free device and one half-used; the workload is mostly whole GPUs."""
    state = ClusterState([node("n0", devices=2), node("n1", devices=2)])
    take(state, pod(0.5), 1, (1,))
    workload = [pod(1, name=f"w{i}") for i in range(9)] + [pod(0.5, name="h")]
    return state, workload


@pytest.mark.parametrize("name", ["fgd", "fgd-balance", "fgd-strand", "fgd-plan"])
def test_fgd_fills_the_half_used_device(name: str) -> None:
    state, workload = fgd_state()
    policy = make_policy(name)
    policy.prepare(state, workload)
    assert policy.place(pod(0.5), state, random.Random(0)) == Choice(1, (1,))


def test_fgd_exact_scores_also_fill_the_half_used_device() -> None:
    state, workload = fgd_state()
    policy = make_policy(
        "fgd", integer_sigmoid=False, first_on_ties=False, coverage=1.0, cpu_only_counts_all=False
    )
    policy.prepare(state, workload)
    assert policy.place(pod(0.5), state, random.Random(0)) == Choice(1, (1,))


def test_fgd_integer_scores_tie_and_first_node_wins() -> None:
    state = ClusterState([node(f"n{i}", devices=2) for i in range(5)])
    policy = make_policy("fgd")
    policy.prepare(state, [pod(1, name=f"w{i}") for i in range(5)])
    assert policy.place(pod(1), state, random.Random(0)).node == 0
    spread = make_policy("fgd", first_on_ties=False)
    spread.prepare(state, [pod(1, name=f"w{i}") for i in range(5)])
    picks = {spread.place(pod(1), state, random.Random(s)).node for s in range(30)}
    assert len(picks) > 1


def test_fgd_works_without_prepare() -> None:
    state, _ = fgd_state()
    assert isinstance(make_policy("fgd").place(pod(0.5), state, random.Random(0)), Choice)


def test_fgd_balance_sends_cpu_pods_to_spare_cpu() -> None:
    """n0 is cpu-poor for its devices; n1's devices are all taken but its cores are free."""
    state = ClusterState(
        [
            node("n0", devices=8, cpu_milli=96_000),
            node("n1", devices=2, cpu_milli=104_000),
        ]
    )
    take(state, pod(2, cpu_milli=8_000), 1, (0, 1))
    workload = [pod(1, cpu_milli=12_000, name=f"w{i}") for i in range(8)] + [
        pod(0, cpu_milli=4_000, name="c")
    ]
    assert place(state, "fgd", pod(0, cpu_milli=4_000)).node == 0
    policy = make_policy("fgd-balance")
    policy.prepare(state, workload)
    assert policy.place(pod(0, cpu_milli=4_000), state, random.Random(0)).node == 1


def cpu_poor_and_cpu_rich() -> ClusterState:
    """n0: 8 devices and 12 cores per device (cpu-poor); n1: 2 devices and 52 cores per device."""
    return ClusterState(
        [node("n0", devices=8, cpu_milli=96_000), node("n1", devices=2, cpu_milli=104_000)]
    )


def test_fgd_strand_sends_cpu_heavy_pods_where_cores_are_plentiful() -> None:
    state = cpu_poor_and_cpu_rich()
    workload = [pod(1, cpu_milli=14_000, name=f"w{i}") for i in range(10)]
    heavy = pod(1, cpu_milli=40_000)
    assert place(state, "fgd", heavy).node == 0  # FGD alone sees no difference: first node wins
    policy = make_policy("fgd-strand", reserve_empty=0)
    policy.prepare(state, workload)
    assert policy.place(heavy, state, random.Random(0)).node == 1


def test_fgd_strand_sends_cpu_light_pods_where_cores_are_scarce() -> None:
    state = cpu_poor_and_cpu_rich()
    state.set_schedulable(0, True)
    workload = [pod(1, cpu_milli=14_000, name=f"w{i}") for i in range(10)]
    policy = make_policy("fgd-strand", reserve_empty=0)
    policy.prepare(state, workload)
    # Reversed node order: a cpu-light pod still goes to the cpu-poor node.
    flipped = ClusterState([state.nodes[1], state.nodes[0]])
    policy.prepare(flipped, workload)
    assert policy.place(pod(1, cpu_milli=1_000), flipped, random.Random(0)).node == 1


def test_fgd_strand_keeps_an_empty_node_for_the_largest_gang() -> None:
    state = ClusterState([node("big", devices=8), node("small", devices=4)])
    take(state, pod(3), 1, (0, 1, 2))
    workload = [pod(8, name="gang")] + [pod(1, name=f"w{i}") for i in range(20)]
    kept = make_policy("fgd-strand", reserve_empty=1, stranding_weight=0.0)
    kept.prepare(state, workload)
    assert kept.place(pod(1), state, random.Random(0)).node == 1
    spent = make_policy("fgd-strand", reserve_empty=0, stranding_weight=0.0)
    spent.prepare(state, workload)
    assert spent.place(pod(1), state, random.Random(0)).node == 0


@pytest.mark.parametrize("keep", [True, False])
def test_fgd_strand_keeps_the_node_on_a_copy_of_the_state_and_not_where_its_capacity_changed(
        keep: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes that could ever host a gang shape are kept for copies of the state (the shadow a
    reservation is searched on) and made again for a copy whose capacity differs."""
    monkeypatch.setattr(fgd_strand, "keep_hosts", keep)
    state = ClusterState([node("big", devices=8), node("small", devices=4)])
    take(state, pod(3), 1, (0, 1, 2))
    workload = [pod(8, cpu_milli=40_000, name="gang")] + [pod(1, name=f"w{i}") for i in range(20)]
    policy = make_policy("fgd-strand", reserve_empty=1, stranding_weight=0.0)
    policy.prepare(state, workload)
    assert policy.place(pod(1), state, random.Random(0)).node == 1  # big is kept for the gang
    assert policy.place(pod(1), clone_state(state), random.Random(0)).node == 1
    shrunk = clone_state(state)
    shrunk.cpu_cap[0] = shrunk.cpu_free[0] = 30_000  # big can no longer hold the gang: not kept
    assert policy.place(pod(1), shrunk, random.Random(0)).node == 0
    assert policy.place(pod(1), clone_state(state), random.Random(0)).node == 1


def test_fgd_strand_learns_the_cpu_ratio_online_without_prepare() -> None:
    state = cpu_poor_and_cpu_rich()
    policy = make_policy("fgd-strand", reserve_empty=0)
    assert isinstance(policy.place(pod(1), state, random.Random(0)), Choice)
    for i in range(5):
        policy.observe(pod(1, cpu_milli=14_000, name=f"o{i}"))
    assert policy.place(pod(1, cpu_milli=40_000), state, random.Random(0)).node == 1


def test_fgd_strand_keeps_unconstrained_pods_off_models_constrained_pods_need() -> None:
    state = ClusterState([node("t4", devices=2, model="T4"), node("v100", devices=2, model="V100M32")])
    workload = [pod(1, models=frozenset({"T4"}), name=f"c{i}") for i in range(4)] + [
        pod(1, name=f"u{i}") for i in range(4)
    ]
    policy = make_policy("fgd-strand", reserve_empty=0)
    policy.prepare(state, workload)
    assert policy.place(pod(1), state, random.Random(0)).node == 1
    pressure = model_pressure(state, workload)
    assert pressure is not None
    assert pressure[state.model_id["T4"]] == 1.0  # four T4-only GPUs asked of two
    assert pressure[state.model_id["V100M32"]] == 0.0
    assert model_pressure(state, [pod(1, name="any")]) is None
