"""Read the YAML files gpupool takes (configuration, prices, budgets, profiles, specs) strictly.

PyYAML's safe loader keeps the last of two equal keys in a mapping, so a file that sets `quota:`
twice, or names a section twice, silently loses the first; every file gpupool reads goes through
`safe_load` here instead, which refuses a repeated key with the line of the repeat. Anything else
is the safe loader's (no Python objects are ever built from a file).
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node

from gpupool.errors import InvalidInput

_MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictSafeLoader(yaml.SafeLoader):
    """yaml.SafeLoader that raises on a key repeated in one mapping (merged keys may be overridden,
    as YAML says)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._open_anchors: set[str] = set()
        """Anchors whose node is being composed: an alias to one would hold itself."""

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if event.anchor in self._open_anchors:
                raise ComposerError(None, None, f"the alias *{event.anchor} refers to the node that holds "
                                    "it, which would hold itself without end; write the value out",
                                    event.start_mark)
            return super().compose_node(parent, index)
        event = self.peek_event()
        anchor = getattr(event, "anchor", None)
        if anchor is None:
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


def safe_load(source: str | bytes | IO[str] | IO[bytes]) -> Any:
    """yaml.safe_load, refusing repeated keys (yaml.YAMLError with the repeat's line)."""
    return yaml.load(source, Loader=StrictSafeLoader)


def read_text(path: Path | str, what: str, *, bound: tuple[int, str] | None = None) -> str:
    """The UTF-8 text of `path` (`what` names it in errors: 'the configuration file'). OSError as
    open() raises it; InvalidInput with one sentence when the file is not UTF-8, or, with `bound`
    (the most bytes, the sentence past them), when it holds more, of which no more is read (a device
    or a pipe named by mistake, such as /dev/zero, has no end)."""
    with open(path, "rb") as handle:
        data = handle.read() if bound is None else handle.read(bound[0] + 1)
    if bound is not None and len(data) > bound[0]:
        raise InvalidInput(bound[1])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InvalidInput(f"Cannot read {what} {str(path)!r}: it is not UTF-8 text (byte "
                           f"0x{data[exc.start]:02x} on line {line}); save it as UTF-8.") from None
