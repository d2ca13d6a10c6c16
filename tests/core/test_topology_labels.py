"""Node labels (`PodRequest.node_labels`) bind topology-constrained gangs too: the domains they
may use are judged on the labelled nodes alone."""

from __future__ import annotations

from dataclasses import replace

import pytest
from net_helpers import gang, nodes_of, run, view_on

from factories import cluster
from gpupool.core.model import Node, Reason, Workload

POLICIES = ("fgd-strand", "network-aware", "best-fit")


def _labelled_gang(spec: str, wid: str) -> Workload:
    w = gang(2, 8, spec, wid=wid)
    return replace(w, pods=tuple(replace(p, node_labels=frozenset({("rack", None)})) for p in w.pods))


def _rack(names: tuple[str, ...]) -> list[Node]:
    """8 nodes in 4 leaves of 2 (n000-n001 share leaf 0); `names` carry the label rack=x."""
    return [replace(n, labels={"rack": "x"}) if n.name in names else n for n in cluster(8)]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_required_in_one_leaf_takes_the_labelled_leaf(policy: str) -> None:
    view = view_on(_rack(("n004", "n005")))
    result = run(view, [_labelled_gang("required=leaf", "leaf")], placement=policy)
    assert sorted(nodes_of(result, "leaf")) == ["n004", "n005"]


@pytest.mark.parametrize("policy", POLICIES)
def test_labelled_nodes_in_two_leaves_refuse_a_one_leaf_gang_and_spread_a_preferring_one(policy: str) -> None:
    pending = [_labelled_gang("required=leaf", "req"), _labelled_gang("preferred=leaf", "pref")]
    result = run(view_on(_rack(("n001", "n002"))), pending, placement=policy)
    assert [(r.workload_id, r.reason) for r in result.rejected] == [("req", Reason.NEVER_FITS)]
    assert sorted(nodes_of(result, "pref")) == ["n001", "n002"]
