"""Read the YAML files gpupool takes (configuration, prices, budgets, profiles, specs) strictly.

PyYAML's safe loader keeps the last of two equal keys in a mapping, so a file that sets `quota:`
twice, or names a section twice, silently loses the first; every file gpupool reads goes through
`safe_load` here instead, which refuses a repeated key with the line of the repeat. Anything else
is the safe loader's (no Python objects are ever built from a file).
"""

from __future__ import annotations

from typing import IO, Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node

from gpupool.textfiles import read_text as read_text

_MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictSafeLoader(yaml.SafeLoader):
    """yaml.SafeLoader that raises on a key repeated in one mapping (merged keys may be overridden,
    as YAML says)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._open_anchors: set[str] = set()
        """Anchors whose node is being composed: an alias to one would hold itself."""

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        alias, event = self.check_event(yaml.AliasEvent), self.peek_event()
        anchor = getattr(event, "anchor", None)
        if alias and anchor in self._open_anchors:
            raise ComposerError(None, None, f"the alias *{anchor} refers to the node that holds it, which "
                                "would hold itself without end; write the value out", event.start_mark)
        if anchor is None or alias:
            return super().compose_node(parent, index)
        self._open_anchors.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._open_anchors.discard(anchor)

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                    seen[key] = key_node.start_mark.line if first is None else first
                except TypeError:  # an unhashable key: the safe loader says so itself
                    continue
                if first is not None:
                    raise ConstructorError(
                        None, None,
                        f"the key {key!r} appears twice in one mapping (first on line {first + 1}); "
                        "keep one", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)  # type: ignore[arg-type]


    def construct_yaml_timestamp(self, node: Node) -> Any:
        """A date or time as the safe loader reads it; one that looks like a date but is none (month
        13, hour 25) is a ConstructorError at its line, not the ValueError the safe loader raises."""
        try:
            return super().construct_yaml_timestamp(node)  # type: ignore[arg-type]
        except ValueError as exc:
            why = str(exc).replace("..", " to ")  # "month must be in 1..12"
            raise ConstructorError(None, None, f"{node.value!r} is not a date or time ({why}); write a real "
                                   "one, such as 2026-12-01, or quote it to keep it as text",
                                   node.start_mark) from None


StrictSafeLoader.add_constructor("tag:yaml.org,2002:timestamp", StrictSafeLoader.construct_yaml_timestamp)


def safe_load(source: str | bytes | IO[str] | IO[bytes]) -> Any:
    """yaml.safe_load, refusing repeated keys (yaml.YAMLError with the repeat's line)."""
    return yaml.load(source, Loader=StrictSafeLoader)
