"""Which gpupool nodes the Ray cluster has: Ray's node table joined with each node agent's description.

A Ray node belongs to the pool when it carries the gpupool node label; its devices come from its
node agent actor. A node that Ray reports dead, or that leaves the table, is gone: it drops out of
the node list at once, and its pods are reported lost only after two node lists without it have
been read, so the server sees the node leave (and requeues its work) before it sees its pods lost.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import ray

from gpupool.core.model import Node
from gpupool.providers.ray.node_agent import NodeDescription
from gpupool.providers.ray.nodeconfig import node_agent_name
from gpupool.providers.ray.settings import NAMESPACE, NODE_LABEL

log = logging.getLogger("gpupool.ray")
DESCRIBE_INTERVAL_S = 5.0
"""How often a node's description (device health) is read again; an injected fault is seen at once
(its call answers with the new description)."""
LOST_AFTER_READS = 2


@dataclass(frozen=True, slots=True)
class RayNode:
    node_id: str
    name: str
    ip: str
    alive: bool


def ray_node_table() -> dict[str, RayNode]:
    """The labelled Ray nodes by gpupool name (an alive entry wins over dead ones of that name)."""
    table: dict[str, RayNode] = {}
    for entry in ray.nodes():
        name = (entry.get("Labels") or {}).get(NODE_LABEL)
        if not name:
            continue
        node = RayNode(entry["NodeID"], name, entry.get("NodeManagerAddress", ""), bool(entry.get("Alive")))
        if name not in table or node.alive:
            table[name] = node
    return table


@dataclass
class _Gone:
    reason: str
    reads: int = 0


class Membership:
    """The pool's nodes as last seen. refresh() talks to Ray (the provider's monitor thread calls it);
    every other method reads what it found and returns at once. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ray: dict[str, RayNode] = {}
        self._described: dict[str, tuple[str, NodeDescription]] = {}
        """name -> (Ray node id it was read from, its description)."""
        self._asked: dict[str, tuple[str, Any]] = {}
        """name -> (node id, pending describe() call)."""
        self._read_at: dict[str, float] = {}
        self._gone: dict[str, _Gone] = {}
        self._nodes: list[Node] = []

    # ---- what Ray says (monitor thread) -----------------------------------------------------
    def refresh(self, wait_s: float = 0.0) -> None:
        """Read Ray's node table and the node agents' answers (waiting up to `wait_s` for them)."""
        table = ray_node_table()
        now = time.monotonic()
        for name, node in table.items():
            if not node.alive or name in self._asked:
                continue
            known = self._described.get(name)
            stale = now - self._read_at.get(name, 0.0) >= DESCRIBE_INTERVAL_S
            if known is None or known[0] != node.node_id or stale:
                try:
                    agent = ray.get_actor(node_agent_name(name), namespace=NAMESPACE)
                except ValueError:
                    continue  # joined, its agent not up yet
                self._asked[name] = (node.node_id, agent.describe.remote())
        self._collect(table, wait_s)
        self._read_published(table)
        with self._lock:
            self._ray = table
            for name, known in list(self._described.items()):
                now_node = table.get(name)
                if now_node is None or not now_node.alive or now_node.node_id != known[0]:
                    del self._described[name]
                    why = ("it left the Ray cluster" if now_node is None or now_node.alive
                           else "Ray reports it dead")
                    self._gone.setdefault(name, _Gone(f"node {name} is no longer in the pool: {why}"))
                    log.warning("node %s lost: %s", name, why)
            for name in list(self._gone):
                if name in self._described:
                    del self._gone[name]  # back (rejoined)
            self._nodes = sorted((d.node for _, d in self._described.values()), key=lambda n: n.name)

    def _collect(self, table: dict[str, RayNode], wait_s: float) -> None:
        if not self._asked:
            return
        refs = [ref for _, ref in self._asked.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        done = set(ready)
        for name, (node_id, ref) in list(self._asked.items()):
            if ref not in done:
                node = table.get(name)
                if node is None or not node.alive:
                    del self._asked[name]
                continue
            del self._asked[name]
            try:
                description = ray.get(ref)
            except ray.exceptions.RayError as exc:
                log.warning("node %s: its agent did not answer (%s)", name, type(exc).__name__)
                continue
            self.update(name, node_id, description)

    def _read_published(self, table: dict[str, RayNode]) -> None:
        """Describe a node its agent has not answered for yet from what its joiner probed."""
        from gpupool.providers.ray.join import published_description

        for name, node in table.items():
            known = self._described.get(name)
            if node.alive and (known is None or known[0] != node.node_id):
                description = published_description(node.node_id)
                if description is not None:
                    self.update(name, node.node_id, description)

    def update(self, name: str, node_id: str, description: NodeDescription) -> None:
        """Take a description just read (the monitor, or an injected fault)."""
        with self._lock:
            known = self._described.get(name)
            if known is not None and known[0] == node_id and known[1].seq > description.seq:
                return  # an answer that was in flight while a later one (a fault) came back
            self._described[name] = (node_id, description)
            self._read_at[name] = time.monotonic()
            self._nodes = sorted((d.node for _, d in self._described.values()), key=lambda n: n.name)

    # ---- readers ----------------------------------------------------------------------------
    def nodes(self) -> list[Node]:
        with self._lock:
            for gone in self._gone.values():
                gone.reads += 1
            return list(self._nodes)

    def description(self, name: str) -> NodeDescription | None:
        with self._lock:
            known = self._described.get(name)
            return None if known is None else known[1]

    def descriptions(self) -> list[NodeDescription]:
        with self._lock:
            return [d for _, d in self._described.values()]

    def table(self) -> dict[str, RayNode]:
        """Ray's node table as last read (every labelled node, dead ones too)."""
        with self._lock:
            return dict(self._ray)

    def ray_node(self, name: str) -> RayNode | None:
        with self._lock:
            known = self._described.get(name)
            node = self._ray.get(name)
            return node if known is not None and node is not None and node.node_id == known[0] else None

    def lost_reason(self, name: str) -> str | None:
        """Why `name`'s pods are lost, once the node's absence has been read twice; else None."""
        with self._lock:
            gone = self._gone.get(name)
            return gone.reason if gone is not None and gone.reads >= LOST_AFTER_READS else None

    def forget(self, name: str) -> None:
        """Stop reporting `name` gone (its pods have all been reported)."""
        with self._lock:
            self._gone.pop(name, None)
