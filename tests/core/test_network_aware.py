"""The network-aware policy: failed links never used, penalised links avoided with hysteresis, shared
links avoided, single pods as its `pods` option says, and without a fabric gangs placed as pods are."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from net_helpers import busy, gang, leaves_of, nodes_of, run, two_level, view_on

from factories import cluster, pod, workload
from gpupool.core.fabric.model import Fabric
from gpupool.core.model import Allocation, ClusterSnapshot, Reason, Workload
from gpupool.core.scheduling.comm_cost import CommModel
from gpupool.core.scheduling.policies.base import NoFit, make_policy, policy_names
from gpupool.core.scheduling.policies.network_aware import NetworkAware
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.topology_spec import UNCONSTRAINED

ONE_FREE_PER_LEAF = [busy(n, 8, f"r{n}") for n in ("n000", "n002", "n004", "n006")]
"""Free: n001 (leaf 0), n003 (leaf 1), n005 (leaf 2), n007 (leaf 3); a 2-node gang must span leaves."""


def uplinks(fabric: Fabric, leaf_desc: str) -> list[tuple[str, int, str, int]]:
    leaf = next(n.id for n in fabric.nodes.values() if n.desc == leaf_desc)
    return [lk.key for lk in fabric.links_by_node[leaf] if fabric.is_switch(lk.other(leaf))]


def access(fabric: Fabric, host: str) -> tuple[str, int, str, int]:
    ca = next(n.id for n in fabric.nodes.values() if n.desc.startswith(host + " "))
    return fabric.links_by_node[ca][0].key


def test_registered_under_its_name() -> None:
    assert "network-aware" in policy_names()
    policy = make_policy("network-aware", message_mb=10.0, max_candidates=2)
    assert isinstance(policy, NetworkAware) and policy.comm == CommModel(message_mb=10.0)


def test_spread_gangs_avoid_a_leaf_whose_uplinks_failed() -> None:
    fabric = two_level()
    view = view_on(running=ONE_FREE_PER_LEAF, fabric=fabric)
    assert view.topology is not None
    for key in uplinks(fabric, "leaf-0"):
        view.topology.set_link(key, healthy=False)
    result = run(view, [gang(2, 8, wid="two")], placement="network-aware")
    assert "n001" not in nodes_of(result, "two")  # leaf 0 is cut off from the spine
    view.remove("two")
    result = run(view, [gang(4, 8, wid="four", spec="none")], placement="network-aware")
    (refused,) = result.rejected  # four nodes are free, but one only across a failed link
    assert refused.reason is Reason.NO_DOMAIN_FITS and "failed link" in refused.message


def test_a_node_whose_hca_link_failed_takes_no_multi_node_gang() -> None:
    fabric = two_level()
    view = view_on(fabric=fabric)
    assert view.topology is not None
    view.topology.set_link(access(fabric, "node00001"), healthy=False)  # n000's HCA
    result = run(view, [gang(2, 8), gang(1, 8, wid="single")], placement="network-aware")
    assert "n000" not in nodes_of(result, "g")
    assert nodes_of(result, "single")  # work on one node does not need the fabric


@pytest.mark.parametrize("placement", ["fgd-strand", "best-fit", "first-fit"])
def test_no_policy_places_a_gang_across_a_failed_link(placement: str) -> None:
    """Only the network-aware policy weighs load and penalties, but whatever the policy a gang whose
    pods could not reach one another is never placed: first-fit would take n001 (leaf 0, cut off)."""
    fabric = two_level()
    view = view_on(running=ONE_FREE_PER_LEAF, fabric=fabric)
    assert view.topology is not None
    assert "n001" in nodes_of(run(view, [gang(2, 8)], placement=placement), "g")  # links up: leaf 0 is fine
    view.remove("g")
    for key in uplinks(fabric, "leaf-0"):
        view.topology.set_link(key, healthy=False)
    placed = nodes_of(run(view, [gang(2, 8)], placement=placement), "g")
    assert "n001" not in placed and view.topology.reachable([view.state.node_index[n] for n in placed])
    view.remove("g")
    (refused,) = run(view, [gang(4, 8, wid="four", spec="none")], placement=placement).rejected
    assert refused.reason is Reason.NO_DOMAIN_FITS and "failed link" in refused.message


def test_the_default_policy_does_not_steer_by_load() -> None:
    """Load and penalties are the network-aware policy's: the default packs as before on busy links."""
    fabric = two_level()
    view = view_on(running=ONE_FREE_PER_LEAF, fabric=fabric)
    assert view.topology is not None
    for key in uplinks(fabric, "leaf-0"):
        view.topology.set_link(key, utilization=0.95)
    assert "n001" in nodes_of(run(view, [gang(2, 8)], placement="first-fit"), "g")


def test_penalised_uplinks_are_avoided_until_they_stay_clean() -> None:
    fabric = two_level()

    def chosen(samples: int) -> set[int]:
        view = view_on(running=ONE_FREE_PER_LEAF, fabric=fabric)
        assert view.topology is not None
        for key in uplinks(fabric, "leaf-0"):
            view.topology.set_link(key, utilization=0.0, errors=5)
            for _ in range(samples):
                view.topology.set_link(key, utilization=0.0)
        return leaves_of(view, nodes_of(run(view, [gang(2, 8)], placement="network-aware"), "g"))

    assert 0 not in chosen(0)
    assert 0 not in chosen(2)  # hysteresis: two clean samples do not lift the penalty
    assert chosen(3) == {0, 1}  # three do: leaf 0 is as good as any, and first


def test_gangs_keep_off_links_other_gangs_already_share() -> None:
    view = view_on(running=ONE_FREE_PER_LEAF)
    assert view.topology is not None
    first = run(view, [gang(2, 8, wid="a", estimate_s=3600.0)], placement="network-aware")
    assert leaves_of(view, nodes_of(first, "a")) == {0, 1}
    second = run(view, [gang(2, 8, wid="b", estimate_s=3600.0)], placement="network-aware")
    assert leaves_of(view, nodes_of(second, "b")) == {2, 3}
    assert set(view.topology.gangs) == {"a", "b"}
    view.remove("a")
    assert set(view.topology.gangs) == {"b"}


def test_the_cost_prefers_one_node_over_two() -> None:
    view = view_on(running=[busy("n000", 4, "half")])
    result = run(view, [gang(2, 4, spec="none")], placement="network-aware")
    assert len(set(nodes_of(result, "g"))) == 1


PARTLY_BUSY = [busy("n002", 4, "r0"), busy("n005", 2, "r1"), busy("n006", 6, "r2"), busy("n000", 1, "r3")]
"""Four nodes partly taken: best-fit and fgd-strand disagree on where the next pods go."""


def _single_pod_decisions(fractional: bool, policy: str, **options: object) -> list[object]:
    view = ClusterView.from_snapshot(ClusterSnapshot(tuple(cluster(8)), tuple(PARTLY_BUSY), {}))
    rng = random.Random(7)
    sizes = [0.25, 0.5, 1, 2, 4] if fractional else [1, 2, 3, 4]
    pending = [workload(pod(rng.choice(sizes), cpu_milli=rng.choice([1000, 8000])), wid=f"w{i}")
               for i in range(12)]
    admitted = run(view, pending, placement=policy, placement_options=options).admitted
    return [(a.workload_id, [(p.node, p.slices) for p in a.placements]) for a in admitted]


@pytest.mark.parametrize(("fractional", "pods", "as_by"), [
    (True, "auto", "fgd-strand"),  # a fractional pod seen: FGD's home ground
    (False, "auto", "best-fit"),  # whole devices only: tight packing
    (False, "fgd-strand", "fgd-strand"),
    (True, "best-fit", "best-fit"),
])
def test_single_pods_are_placed_as_the_pods_option_says(fractional: bool, pods: str, as_by: str) -> None:
    other = "fgd-strand" if as_by == "best-fit" else "best-fit"
    ours = _single_pod_decisions(fractional, "network-aware", pods=pods)
    assert ours == _single_pod_decisions(fractional, as_by)
    assert ours != _single_pod_decisions(fractional, other)  # the two differ here: the check can fail


def test_auto_turns_to_fgd_strand_at_the_first_fractional_pod_it_is_told_of() -> None:
    policy = NetworkAware()
    state = ClusterView.empty(cluster(2, devices=4)).state
    whole = pod(1)
    assert policy._by_best_fit()
    policy.observe(whole)
    assert policy._by_best_fit()
    policy.observe(pod(0.5))
    assert not policy._by_best_fit()
    policy.prepare(state, [whole])  # a fresh workload of whole devices only
    assert policy._by_best_fit()
    assert not isinstance(policy.place(pod(0.25), state, random.Random(0)), NoFit)
    assert not policy._by_best_fit()


def test_an_unknown_pods_option_is_refused_in_one_sentence() -> None:
    with pytest.raises(ValueError, match="pods= is one of auto, best-fit, fgd-strand, got 'tight'"):
        make_policy("network-aware", pods="tight")
    with pytest.raises(ValueError, match="fullest_leaf= is true or false, got 'yes please'"):
        make_policy("network-aware", fullest_leaf="yes please")


@pytest.mark.parametrize(("spec", "pods", "as_by"), [
    (None, "auto", "best-fit"), ("required=leaf", "auto", "best-fit"),
    (None, "fgd-strand", "fgd-strand"), ("required=leaf", "fgd-strand", "fgd-strand"),
])
def test_without_a_fabric_gangs_are_placed_as_single_pods_are(
    spec: str | None, pods: str, as_by: str
) -> None:
    def decisions(policy: str, **options: object) -> list[tuple[str, ...]]:
        view = ClusterView.from_snapshot(ClusterSnapshot(tuple(cluster(8)), tuple(PARTLY_BUSY), {}))
        pending = [gang(n, g, spec, wid=f"g{i}") for i, (n, g) in enumerate(((3, 2), (2, 4), (2, 3), (2, 1)))]
        admitted = run(view, pending, placement=policy, placement_options=options).admitted
        return [tuple(p.node for p in a.placements) for a in admitted]

    assert decisions("best-fit") != decisions("fgd-strand")  # the check below can fail
    assert decisions("network-aware", pods=pods) == decisions(as_by)


def test_unconstrained_spec_text_is_none() -> None:
    assert str(UNCONSTRAINED) == "none"


@pytest.mark.parametrize("placement", ["first-fit", "network-aware"])
def test_a_gang_cut_off_by_failed_links_waits_for_the_repair(placement: str) -> None:
    """Failed links are repaired: a gang they cut off waits (not final) and starts once they are up."""
    fabric = two_level()
    view = view_on(fabric=fabric)  # 8 free nodes; the gang needs every one of them
    assert view.topology is not None
    for key in uplinks(fabric, "leaf-0"):
        view.topology.set_link(key, healthy=False)
    (waiting,) = run(view, [gang(8, 8, wid="all", spec="none")], placement=placement).rejected
    assert not waiting.final and waiting.reason is not Reason.NEVER_FITS
    for key in uplinks(fabric, "leaf-0"):
        view.topology.set_link(key, healthy=True)
    assert len(nodes_of(run(view, [gang(8, 8, wid="all", spec="none")], placement=placement), "all")) == 8


def _first_pod_node(view: ClusterView, **options: object) -> str:
    result = run(view, [workload(pod(1), wid="one")], placement="network-aware", placement_options=options)
    return nodes_of(result, "one")[0]


def test_fullest_leaf_breaks_best_fits_ties_by_the_leaf_with_least_free() -> None:
    """A pod that fits several nodes equally well goes to the fullest leaf, keeping leaf 0 whole."""
    running = [busy("n003", 8, "full")]  # leaf 1 (n002-n003) is half taken, every other leaf free
    assert _first_pod_node(view_on(running=running)) == "n000"  # plain best-fit: node order
    assert _first_pod_node(view_on(running=running), fullest_leaf=True) == "n002"


def test_fullest_leaf_never_overrides_a_tighter_node() -> None:
    running = [busy("n000", 6, "most"), busy("n003", 8, "full")]  # leaf 1 fuller, n000 the tightest fit
    assert _first_pod_node(view_on(running=running), fullest_leaf=True) == "n000"


def test_fullest_leaf_without_a_fabric_is_plain_best_fit() -> None:
    def decisions(**options: object) -> list[object]:
        view = ClusterView.from_snapshot(ClusterSnapshot(tuple(cluster(8)), tuple(PARTLY_BUSY), {}))
        pending = [workload(pod(g), wid=f"w{i}") for i, g in enumerate([8, 1, 2, 8, 3, 1])]
        admitted = run(view, pending, placement="network-aware", placement_options=options).admitted
        return [(a.workload_id, [p.node for p in a.placements]) for a in admitted]

    assert decisions(fullest_leaf=True) == decisions()


def _gang_decision(running: list[Allocation], pending: Workload) -> tuple[object, ...]:
    result = run(view_on(running=running), [pending], placement="network-aware")
    if result.admitted:
        return ("placed", [p.node for p in result.admitted[0].placements])
    (refused,) = result.rejected
    return ("refused", refused.reason)  # the words differ: the count words its own refusal


@pytest.mark.parametrize("seed", range(24))
def test_a_gang_decides_alike_with_and_without_the_quick_count(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the quick count says a gang fits nowhere, its candidates are not tried: the verdict (and
    every placement) is the one trying them all gives, for the same reason (the count words it,
    test_network_aware_refusal.py). is_repeatable False turns the count off."""
    rng = random.Random(seed)
    taken = rng.sample(range(8), rng.randint(2, 8))
    running = [busy(f"n{i:03d}", rng.choice([1, 4, 6, 8]), f"r{i}") for i in taken]
    spec = rng.choice([None, "preferred=leaf", "none"])
    pending = gang(rng.choice([2, 3, 4]), rng.choice([2, 4, 8]), spec=spec)
    quick = _gang_decision(running, pending)
    monkeypatch.setattr(NetworkAware, "is_repeatable", lambda self: False)
    assert _gang_decision(running, pending) == quick


def test_a_gang_that_fits_nowhere_tries_no_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[object] = []
    candidates = NetworkAware._candidates

    def counted(self: NetworkAware, *args: Any) -> Iterator[Any]:
        tried.append(args)
        yield from candidates(self, *args)

    monkeypatch.setattr(NetworkAware, "_candidates", counted)
    for free, tries in ((1, False), (2, True)):  # one free node: the gang needs two
        view = view_on(running=[busy(f"n{i:03d}", 8, f"r{i}") for i in range(8 - free)])
        if run(view, [gang(2, 8, wid="probe")], placement="network-aware").admitted:  # (ever fits?)
            view.remove("probe")
        tried.clear()
        result = run(view, [gang(2, 8)], placement="network-aware")
        assert bool(tried) is tries and bool(result.admitted) is tries
        if not tries:
            assert result.rejected[0].reason is Reason.GANG_INCOMPLETE
