"""GET /nodes as JSON bytes, each node's part built once and kept until what it shows changes.

At 1,000 nodes of 8 devices a listing is 8,000 device rows: building and serialising them for every
poll of the dashboard cost about 0.4 s. Here a node's JSON is rebuilt only when its provider entry,
its flags, the pods it holds or the provider's missing capabilities change, separately for each
viewer (the admin, or one tenant, who sees only its own slices). The answer carries an ETag, so a
poller can skip an unchanged listing (`If-None-Match` -> 304).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.core.model import Node
from gpupool.providers.base import Capability
from gpupool.server.auth import Principal
from gpupool.server.held import EMPTY_NODE, HeldView, NodeHeld
from gpupool.server.orm import NodeFlagRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.nodes import has_flags, lost_out, node_flags, node_out, node_use

MOST_KEPT = 200_000
"""Node parts kept (nodes x viewers) before the cache is emptied and starts again."""
MOST_ANSWERS = 1_000
"""Whole answers kept (one per viewer) before they are all dropped."""


@dataclass(frozen=True, slots=True)
class Listing:
    body: bytes
    etag: str


@dataclass(frozen=True, slots=True)
class _Part:
    node: Node | None
    flags: tuple[Any, ...] | None
    held: NodeHeld
    missing: tuple[Any, ...]
    body: bytes


class NodeListing:
    """The per-(viewer, node) parts of the listing; one per process, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[tuple[str | None, str], _Part] = {}
        self._answers: dict[str | None, tuple[tuple[Any, ...], Listing, HeldView]] = {}
        """The last whole answer per viewer, with what it was built from (the view is kept so
        that its id is not reused while the answer is)."""

    def listing(self, rt: Runtime, who: Principal) -> Listing:
        """The provider's nodes in its order, then the lost ones (active pods or flags set, no
        longer listed) by name; the ETag is a digest of the body."""
        nodes = rt.nodes()
        with rt.store.read() as session:
            flags = node_flags(session)
            view = rt.held.read(session.connection())
        missing_map = rt.provider.missing_capabilities()
        missing = tuple(sorted((str(k), v) for k, v in missing_map.items()))
        flag_keys = tuple(sorted((name, _flag_key(row)) for name, row in flags.items()))
        whole = (who.tenant, view.version, id(view), nodes, flag_keys, missing)
        with self._lock:
            last = self._answers.get(who.tenant)
        if last is not None and _same(last[0], whole):
            return last[1]
        live = {n.name for n in nodes}
        known = {n for n, h in view.by_node.items() if h.pods} | {n for n, r in flags.items() if has_flags(r)}
        lost = sorted(n for n in known - live if n)
        parts: list[bytes] = []
        with self._lock:
            if len(self._parts) > MOST_KEPT:
                self._parts.clear()
            for node in nodes:
                parts.append(self._part(who, node.name, node, flags.get(node.name),
                                        view.by_node.get(node.name, EMPTY_NODE), missing, missing_map))
            for name in lost:
                parts.append(self._part(who, name, None, flags.get(name),
                                        view.by_node.get(name, EMPTY_NODE), (), missing_map))
        body = b"[" + b",".join(parts) + b"]"
        answer = Listing(body, '"' + hashlib.blake2b(body, digest_size=16).hexdigest() + '"')
        with self._lock:
            if len(self._answers) > MOST_ANSWERS:
                self._answers.clear()
            self._answers[who.tenant] = (whole, answer, view)
        return answer

    def _part(self, who: Principal, name: str, node: Node | None, flags: NodeFlagRow | None,
              held: NodeHeld, missing: tuple[Any, ...], missing_map: Mapping[Capability, str]) -> bytes:
        """One node's JSON (`node` None: a lost node), from the cache when nothing it shows changed."""
        key = (who.tenant, name)
        flag_key = _flag_key(flags)
        kept = self._parts.get(key)
        if (kept is not None and kept.flags == flag_key and kept.missing == missing
                and (kept.held is held or kept.held == held) and (kept.node is node or kept.node == node)):
            return kept.body
        use = node_use(held)
        out = lost_out(name, flags, use) if node is None else node_out(node, flags, use, missing_map, who)
        body = out.__pydantic_serializer__.to_json(out)
        self._parts[key] = _Part(node, flag_key, held, missing, body)
        return body


_LISTING = NodeListing()


def listing(rt: Runtime, who: Principal) -> Listing:
    """GET /nodes for `who` (the parts are shared by every runtime of this process: a part is
    reused only when everything it is built from is equal)."""
    return _LISTING.listing(rt, who)


def _same(kept: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
    """Whether a whole answer's inputs are unchanged (the node list by identity first)."""
    return all(a is b or a == b for a, b in zip(kept, now, strict=True))


def _flag_key(flags: NodeFlagRow | None) -> tuple[Any, ...] | None:
    if flags is None:
        return None
    return (flags.cordoned, flags.draining, flags.failed, tuple(flags.failed_devices or ()))


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an If-None-Match header names `etag` (weak or strong, or `*`)."""
    if not if_none_match:
        return False
    for candidate in if_none_match.split(","):
        tag = candidate.strip()
        if tag == "*" or tag.removeprefix("W/") == etag:
            return True
    return False
