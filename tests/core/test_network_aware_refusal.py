"""A gang the quick count says fits nowhere is refused without a placement: the reason is the one the
plain placement gives (which no longer runs only to word the refusal), the words come from the count."""

from __future__ import annotations

import random
from typing import Any

import pytest
from net_helpers import busy, gang, two_level, view_on

from gpupool.core.model import Reason
from gpupool.core.scheduling.domains import room_for
from gpupool.core.scheduling.policies.base import NoFit, PlacementPolicy, make_policy
from gpupool.core.scheduling.policies.network_aware import NetworkAware
from gpupool.core.scheduling.topology import ACCESS, TopologyContext
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.topology_spec import parse_topology_spec


def _bound(view: ClusterView, default: str | None = None) -> NetworkAware:
    policy = make_policy("network-aware")
    assert isinstance(policy, NetworkAware) and view.topology is not None
    spec = None if default is None else parse_topology_spec(default)
    policy.bind_topology(TopologyContext(view.topology, default=spec))
    return policy


def _counting_places(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    calls: list[object] = []
    place = NetworkAware.place

    def counted(self: NetworkAware, *args: Any) -> Any:
        calls.append(args)
        return place(self, *args)

    monkeypatch.setattr(NetworkAware, "place", counted)
    return calls


def test_the_refusal_without_a_placement_has_the_plain_placements_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Random busy pools and gangs of every constraint the count words (none, preferred, required):
    whenever the count says no, the policy places no pod, leaves the state as it was, and refuses for
    the plain placement's reason (required: in its very words); the count's words say what is short."""
    checked: dict[Reason, int] = {}
    for seed in range(160):
        rng = random.Random(seed)
        taken = rng.sample(range(8), rng.randint(4, 8))
        running = [busy(f"n{i:03d}", rng.choice([2, 4, 6, 8]), f"r{i}") for i in taken]
        spec = rng.choice([None, "preferred=leaf", "required=leaf", "required=spine", "none"])
        pending = gang(rng.choice([2, 3, 4, 6]), rng.choice([2, 4, 8]), spec=spec)
        view = view_on(running=running)
        policy = _bound(view)
        state = view.state
        assert view.topology is not None
        if room_for(pending.pods, state, view.topology.avail[ACCESS] > 0).anywhere():
            continue  # the count lets this gang be tried (the cases it does not are the point)
        free_before = state.dev_milli_free.copy()
        calls = _counting_places(monkeypatch)
        refused = policy.place_gang(pending, state, random.Random(0))
        assert isinstance(refused, NoFit) and not calls, seed
        assert (state.dev_milli_free == free_before).all()
        monkeypatch.undo()
        plain = PlacementPolicy.place_gang(policy, pending, state, random.Random(0))
        assert isinstance(plain, NoFit) and refused.reason is plain.reason, seed
        if refused.reason is Reason.NO_DOMAIN_FITS:
            assert refused.message == plain.message
        else:
            assert refused.reason is Reason.GANG_INCOMPLETE
            assert refused.message.startswith(f"The {len(pending.pods)}-pod gang does not fit now: ")
            assert refused.message.endswith("; none of the gang was placed.")
        checked[refused.reason] = checked.get(refused.reason, 0) + 1
    assert checked.get(Reason.GANG_INCOMPLETE, 0) >= 20, checked
    assert checked.get(Reason.NO_DOMAIN_FITS, 0) >= 10, checked


def test_the_words_say_which_count_fell_short() -> None:
    """Too few free devices in all, or enough devices but too few nodes with room for a pod."""
    view = view_on(running=[busy(f"n{i:03d}", 8, f"r{i}") for i in range(7)])  # one node free
    policy = _bound(view)
    refused = policy.place_gang(gang(2, 8), view.state, random.Random(0))
    assert isinstance(refused, NoFit)
    assert "8 devices are free of the 16 it asks" in refused.message
    view = view_on(running=[busy(f"n{i:03d}", 5, f"r{i}") for i in range(8)])  # 3 free on each
    refused = _bound(view).place_gang(gang(2, 4), view.state, random.Random(0))
    assert isinstance(refused, NoFit) and refused.reason is Reason.GANG_INCOMPLETE
    assert "nodes have room for 0 of its 2 pods of 4 devices" in refused.message


def test_a_node_cut_off_keeps_the_plain_placements_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a node's HCA link down the count covers only the wired nodes: the plain placement on the
    whole pool still words the refusal (it may fit there, only across the failed link)."""
    fabric = two_level()
    view = view_on(running=[busy(f"n{i:03d}", 8, f"r{i}") for i in range(2, 8)], fabric=fabric)
    assert view.topology is not None
    ca = next(n.id for n in fabric.nodes.values() if n.desc.startswith("node00001 "))
    view.topology.set_link(fabric.links_by_node[ca][0].key, healthy=False)  # n000's HCA
    policy = _bound(view)
    calls = _counting_places(monkeypatch)
    refused = policy.place_gang(gang(2, 8), view.state, random.Random(0))
    assert isinstance(refused, NoFit) and refused.reason is Reason.NO_DOMAIN_FITS and calls
    assert "failed link" in refused.message
