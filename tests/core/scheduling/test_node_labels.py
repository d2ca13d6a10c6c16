"""Node labels a pod requires (`PodRequest.node_labels`): every placement path keeps the pod off
the nodes that lack them: each policy, gangs, preemption's victim choice and backfill's shadow."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from factories import POLICY_NAMES, cluster, node, pod, workload
from gpupool.core.model import Labels, Node, PodRequest, Reason, Workload
from gpupool.core.scheduling.cycle import Policies, Refuse, Wait, cycle_on
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.state import ClusterState

CONTAINERS = "gpupool.io/containers"
NEEDS_CRUN: Labels = frozenset({(CONTAINERS, None)})


def _labelled(n: Node, **labels: str) -> Node:
    return replace(n, labels={k.replace("_", "."): v for k, v in labels.items()})


def _pool(count: int, labelled: tuple[int, ...], devices: int = 4) -> list[Node]:
    """`count` nodes; those at the `labelled` indices carry gpupool.io/containers=crun."""
    nodes = cluster(count, devices=devices)
    return [replace(n, labels={CONTAINERS: "crun"}) if i in labelled else n for i, n in enumerate(nodes)]


def _need(p: PodRequest, labels: Labels = NEEDS_CRUN) -> PodRequest:
    return replace(p, node_labels=labels)


def _nodes_of(result: object, wid: str) -> set[str]:
    admitted = {a.workload_id: a for a in result.admitted}  # type: ignore[attr-defined]
    return {p.node for p in admitted[wid].placements}


def test_labelled_matches_key_alone_or_key_and_value() -> None:
    both = replace(node("b"), labels={CONTAINERS: "crun", "zone": "2"})
    nodes = [_labelled(node("a"), zone="1"), both, node("c")]
    state = ClusterState(nodes)
    assert state.labelled(frozenset()).tolist() == [True, True, True]
    assert state.labelled(NEEDS_CRUN).tolist() == [False, True, False]
    assert state.labelled(frozenset({("zone", None)})).tolist() == [True, True, False]
    assert state.labelled(frozenset({("zone", "1")})).tolist() == [True, False, False]
    assert state.labelled(frozenset({("zone", "2"), (CONTAINERS, "crun")})).tolist() == [False, True, False]
    assert state.labelled(frozenset({(CONTAINERS, "podman")})).tolist() == [False, False, False]


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("gpus", [0, 0.5, 1, 4])
def test_every_policy_places_only_on_labelled_nodes(policy: str, gpus: float) -> None:
    # The labelled node is the last: first-fit, packing and the rest would pick another one.
    view = ClusterView.empty(_pool(4, labelled=(3,), devices=8))
    pending = [workload(_need(pod(gpus)), wid=f"w{i}", submit_s=i) for i in range(2)]
    result = cycle_on(view, pending, Policies(placement=policy, ordering="fifo"), 0.0, random.Random(0))
    assert {a.workload_id for a in result.admitted} == {"w0", "w1"}
    assert _nodes_of(result, "w0") | _nodes_of(result, "w1") == {"n003"}


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_gang_spreads_only_over_labelled_nodes(policy: str) -> None:
    view = ClusterView.empty(_pool(4, labelled=(1, 3)))
    gang = workload(*(_need(pod(4, name=f"p{i}")) for i in range(2)), wid="gang")
    result = cycle_on(view, [gang], Policies(placement=policy, ordering="fifo"), 0.0, random.Random(0))
    assert _nodes_of(result, "gang") == {"n001", "n003"}


def test_a_constraint_no_node_meets_is_refused_naming_it() -> None:
    view = ClusterView.empty(_pool(2, labelled=(1,)))
    podman = _need(pod(1), frozenset({(CONTAINERS, "podman")}))
    cpu_only = _need(pod(0), frozenset({("zone", None)}))
    pending = [workload(podman, wid="podman"), workload(cpu_only, wid="cpu")]
    result = cycle_on(view, pending, Policies(placement="fgd-strand"), 0.0, random.Random(0))
    assert not result.admitted
    refused = {r.workload_id: r for r in result.rejected}
    assert all(type(r) is Refuse and r.reason is Reason.NEVER_FITS for r in refused.values())
    assert f"{CONTAINERS}=podman" in refused["podman"].message
    assert "zone" in refused["cpu"].message and "0 of 2 node(s)" in refused["cpu"].message


def test_full_labelled_nodes_make_the_work_wait_saying_the_constraint_narrows_the_choice() -> None:
    view = ClusterView.empty(_pool(3, labelled=(2,)))
    first = cycle_on(view, [workload(_need(pod(4)), wid="fill")], Policies(), 0.0, random.Random(0))
    assert _nodes_of(first, "fill") == {"n002"}
    result = cycle_on(view, [workload(_need(pod(1)), wid="late")], Policies(), 1.0, random.Random(0))
    assert not result.admitted  # two whole nodes are free, but neither carries the label
    (wait,) = result.rejected
    assert type(wait) is Wait and wait.reason is Reason.INSUFFICIENT_DEVICES
    assert f"its constraint {CONTAINERS} narrows the choice to 1 of 3 node(s)" in wait.message


def test_preemption_takes_victims_only_where_the_preemptor_may_run() -> None:
    view = ClusterView.empty(_pool(2, labelled=(1,)))
    ff = Policies(placement="first-fit", ordering="priority-fifo", preemption=True)
    # Oldest (most lost work) on the labelled node, the newest on the other one: without the
    # constraint the victim would be the newest, on n000.
    old = workload(_need(pod(4)), wid="old", submit_s=0)
    assert _nodes_of(cycle_on(view, [old], ff, 0.0, random.Random(0)), "old") == {"n001"}
    new = workload(pod(4), wid="new", submit_s=1)
    assert _nodes_of(cycle_on(view, [new], ff, 90.0, random.Random(0)), "new") == {"n000"}
    high = replace(workload(_need(pod(4)), wid="urgent", submit_s=5), priority_class="high")
    result = cycle_on(view, [high], ff, 100.0, random.Random(0))
    assert [p.workload_id for p in result.preempted] == ["old"]
    assert _nodes_of(result, "urgent") == {"n001"}


def test_backfill_reserves_the_head_on_labelled_nodes_and_fills_the_others() -> None:
    easy = Policies(placement="first-fit", ordering="fifo", backfill=True)
    view = ClusterView.empty(_pool(2, labelled=(1,), devices=2))
    long = replace(workload(_need(pod(2)), wid="long"), runtime_estimate_s=1000.0)
    assert _nodes_of(cycle_on(view, [long], easy, 0.0, random.Random(0)), "long") == {"n001"}
    head = replace(workload(_need(pod(2)), wid="head", submit_s=1), runtime_estimate_s=50.0)
    other = replace(workload(pod(2), wid="other", submit_s=2), runtime_estimate_s=5000.0)
    result = cycle_on(view, [head, other], easy, 10.0, random.Random(0))
    # n000 is free, but the head may only use n001: it waits for "long" to end, and work that
    # does not touch n001 backfills onto n000 however long it runs.
    assert result.reservation is not None
    assert (result.reservation.workload_id, result.reservation.start_s) == ("head", 1000.0)
    assert [a.workload_id for a in result.admitted] == ["other"]
    assert _nodes_of(result, "other") == {"n000"}


def _workloads_with(labels: Labels, count: int) -> list[Workload]:
    return [workload(_need(pod(1), labels), wid=f"w{i}", submit_s=i) for i in range(count)]


def test_a_key_with_a_value_matches_only_that_value() -> None:
    nodes = [_labelled(node("a", devices=2), zone="1"), _labelled(node("b", devices=2), zone="2")]
    view = ClusterView.empty(nodes)
    result = cycle_on(view, _workloads_with(frozenset({("zone", "2")}), 3), Policies(), 0.0, random.Random(0))
    assert {p.node for a in result.admitted for p in a.placements} == {"b"}
    assert len(result.admitted) == 2 and [r.workload_id for r in result.rejected] == ["w2"]


def test_workloads_of_one_shape_but_other_labels_are_judged_apart() -> None:
    view = ClusterView.empty(_pool(2, labelled=(1,)))
    nowhere = workload(_need(pod(1), frozenset({("zone", None)})), wid="nowhere", submit_s=0)
    anywhere = workload(pod(1), wid="anywhere", submit_s=1)
    result = cycle_on(view, [nowhere, anywhere], Policies(), 0.0, random.Random(0))
    assert [a.workload_id for a in result.admitted] == ["anywhere"]
    assert [(r.workload_id, r.reason) for r in result.rejected] == [("nowhere", Reason.NEVER_FITS)]


def test_the_label_masks_a_state_keeps_are_bounded() -> None:
    # Tenants choose their label sets: a state must not keep one mask per set it ever saw.
    state = ClusterState(_pool(2, labelled=(1,)))
    plain = state.allowed_devices(frozenset())
    for i in range(1000):
        labels = frozenset({(CONTAINERS, None), ("k", str(i))})
        assert not state.allowed_devices(frozenset(), labels).any()
    assert len(state._label_cache) <= 256 and len(state._labelled_cache) <= 256
    assert state.allowed_devices(frozenset()) is plain  # the masks without labels stay


def test_labelled_nodes_without_devices_say_so() -> None:
    nodes = [node("gpu", devices=4), replace(node("cpu", devices=0), labels={"zone": "a"})]
    view = ClusterView.empty(nodes)
    pending = [workload(_need(pod(1), frozenset({("zone", "a")})), wid="w")]
    result = cycle_on(view, pending, Policies(), 0.0, random.Random(0))
    (refused,) = result.rejected
    assert refused.reason is Reason.NEVER_FITS
    assert refused.message.endswith("No node with the labels zone=a has a device.")

