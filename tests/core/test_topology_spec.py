"""The --topology grammar: required / preferred / slice, 'none', one-sentence errors, what applies to whom."""

from __future__ import annotations

import pytest

from gpupool.core.topology_spec import UNCONSTRAINED, Tier, TopologySpec, effective_spec, parse_topology_spec
from gpupool.errors import InvalidInput


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("required=leaf", TopologySpec(required=Tier.LEAF)),
        ("preferred=spine", TopologySpec(preferred=Tier.SPINE)),
        ("slice=4@leaf", TopologySpec(slice_size=4)),
        ("slice=2", TopologySpec(slice_size=2)),
        ("required=spine,slice=4@leaf", TopologySpec(required=Tier.SPINE, slice_size=4)),
        (" Preferred = LEAF ", TopologySpec(preferred=Tier.LEAF)),
        ("none", UNCONSTRAINED),
        ("", UNCONSTRAINED),
    ],
)
def test_parse(text: str, spec: TopologySpec) -> None:
    assert parse_topology_spec(text) == spec
    assert parse_topology_spec(str(spec)) == spec  # the text form reads back


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("required=rack", "Unknown topology tier 'rack'"),
        ("required=leaf,preferred=spine", "either required or preferred"),
        ("slice=0@leaf", "at least 1 pod"),
        ("slice=x@leaf", "needs a pod count"),
        ("leaf", "Cannot read topology"),
        ("wanted=leaf", "Unknown topology key"),
        ("required=leaf,required=spine", "twice"),
        ("required=leaf,slice=2@spine", "wider than required"),
    ],
)
def test_errors_are_one_sentence(text: str, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_topology_spec(text)
    message = caught.value.message
    assert words in message
    assert message.endswith(".") and message.count(". ") == 0


def test_what_applies_to_a_workload() -> None:
    default = TopologySpec(preferred=Tier.LEAF)
    assert effective_spec(None, default, pods=4, fractional=False) == default
    assert effective_spec(None, default, pods=1, fractional=False) is None  # single pod
    assert effective_spec(TopologySpec(required=Tier.LEAF), default, pods=2, fractional=True) is None
    assert effective_spec(UNCONSTRAINED, default, pods=4, fractional=False) is None  # 'none' wins
    spine = TopologySpec(required=Tier.SPINE)
    assert effective_spec(spine, default, pods=4, fractional=False) == spine
    assert effective_spec(None, None, pods=4, fractional=False) is None
