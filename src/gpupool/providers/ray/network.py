"""Pod network namespaces on Ray nodes: each machine's block of the pod network, its routes to the
other machines' blocks, and each tenant's pods known on every machine.

The provider (`RayNetwork.sync`, from its monitor) hands each machine that joins a block (a /19
slot of GPUPOOL_POD_NETWORK) from the server's store (server/services/netblocks.py; compare-and-set,
so two servers never give one block twice) and gives it back when the machine leaves. It sends
every node agent its `NetworkPlan`: its slot, and every machine's (node, slot, node address), from
which the agent routes the other machines' blocks through their node addresses (agent/netns.py,
PodNetwork.set_routes), and the server's addresses, from which alone a service replica there is
reached at the node's address (PodNetwork.set_servers). The plan is sent again whenever a machine
joins or leaves, and before any launch on a node (Ray runs one caller's calls to an actor in order,
so the plan is in place when the pod arrives). A node is listed (schedulable) once its agent has
answered its plan, so a gang's MASTER_ADDR, the rank-0 pod's address computed from the block
(`gang_address`), is the one the agent gives that pod.

Each agent tells the agents of the other machines of every pod it attaches before the pod starts,
and of the addresses its ended pods gave up (`NodeAgentActor.network_members`, in a concurrency group
of its own, so two agents announcing to each other never wait on each other's launch), each word
numbered so the receiver applies them in the order said (netns.PodNetwork.told). An agent that takes
a plan naming a machine it has not heard of under that join tells it all its pods as a whole; an
agent's first plan (a restarted agent's too: Ray starts it again on the same Ray node, so no machine
sees a join) also takes every other machine's whole set from its agent (`network_snapshot`), so
what started or ended while it was away is in its table. An agent keeps its last plan in its state
directory, and one Ray restarts takes it again (and those sets) before it answers any call.
Machines that share one host (simulated nodes) share that host's table, and tell each other nothing.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from gpupool.agent.netns import NetnsMode, NetworkSettings, blocks_in, gang_address_in, node_subnet
from gpupool.errors import GpupoolError
from gpupool.providers.base import MemoryBlocks, NetworkBlocks
from gpupool.providers.ray.membership import RayNode

log = logging.getLogger("gpupool.ray")
RESEND_S = 5.0
"""A plan whose node's description says its agent has no block (a restarted agent that could not
read the plan it kept) is sent again after this long."""


@dataclass(frozen=True, slots=True)
class NetworkPlan:
    """What a node agent needs to give its pods namespaces: its block and every machine's."""

    settings: NetworkSettings
    published: tuple[tuple[str, int], ...]
    slot: int
    peers: tuple[tuple[str, int, str], ...]
    """(node, slot, node address) of every machine of the pool, this one included."""
    machines: tuple[tuple[str, str], ...] = ()
    """(node, the Ray node id of its join): a node that joined again is told of the pods anew."""
    servers: tuple[str, ...] = ()
    """The server's addresses (its machine's, as Ray knows it): the only ones from which a service
    replica is reached at its node's address (the pool's router and probes; agent/netns.py)."""

    def to_json(self) -> str:
        """What the agent keeps in its state directory: an agent Ray restarts takes it again at once."""
        s = self.settings
        return json.dumps({"mode": s.mode.value, "pod_network": str(s.pod_network),
                           "reachable": [str(n) for n in s.reachable], "published": self.published,
                           "slot": self.slot, "peers": self.peers, "machines": self.machines,
                           "servers": self.servers})

    @classmethod
    def from_json(cls, text: str) -> NetworkPlan | None:
        """The plan `to_json` wrote (None when it cannot be read as one)."""
        try:
            data = json.loads(text)
            settings = NetworkSettings(NetnsMode(data["mode"]), ipaddress.IPv4Network(data["pod_network"]),
                                       tuple(ipaddress.IPv4Network(n) for n in data["reachable"]))
            return cls(settings, tuple((str(h), int(p)) for h, p in data["published"]), int(data["slot"]),
                       tuple((str(n), int(s), str(a)) for n, s, a in data["peers"]),
                       tuple((str(n), str(m)) for n, m in data["machines"]),
                       tuple(str(ipaddress.IPv4Address(a)) for a in data.get("servers", ())))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass
class _Sent:
    machine: str
    plan: NetworkPlan
    ref: Any
    """The agent's answer while it is on its way (None once taken)."""
    at: float


class RayNetwork:
    """The provider's side: blocks, plans, and which nodes' agents have taken theirs."""

    def __init__(self, settings: NetworkSettings | None, published: Sequence[tuple[str, int]] = ()) -> None:
        self.settings = settings
        self.published = tuple((str(host), int(port)) for host, port in published)
        self.servers: tuple[str, ...] = ()
        """This machine's address as Ray knows it (read at the first sync: Ray is up by then)."""
        self.blocks: NetworkBlocks = MemoryBlocks()
        self._held: dict[str, tuple[str, int]] = {}
        """node -> (the machine, i.e. Ray node id, that holds it, its slot)."""
        self._sent: dict[str, _Sent] = {}
        self._ready: dict[str, bool] = {}
        """Nodes whose agent answered its plan -> whether its pods get namespaces."""
        self._lock = threading.RLock()

    def use_blocks(self, blocks: NetworkBlocks) -> None:
        """Hand blocks out of `blocks` (the server's store) from now on: the machines known already
        take theirs from it (the same, unless it says otherwise; then their plans are sent again)."""
        with self._lock:
            self.blocks = blocks
            if not self.on or self.settings is None:
                return
            capacity = blocks_in(self.settings.pod_network)
            for name, (machine, slot) in list(self._held.items()):
                try:
                    stored = blocks.assign(name, machine, capacity)
                except GpupoolError as exc:
                    log.warning("node %s: no block of the pod network: %s", name, exc)
                    continue
                if stored != slot:
                    self._held[name] = (machine, stored)
                    self._sent.pop(name, None)

    @property
    def on(self) -> bool:
        return self.settings is not None and self.settings.mode is not NetnsMode.OFF

    def ready(self, node: str) -> bool:
        """Whether `node` may be scheduled: its agent has its plan (always, with namespaces off)."""
        return not self.on or node in self._ready

    def slot(self, node: str) -> int | None:
        held = self._held.get(node)
        return None if held is None else held[1]

    def gang_address(self, node: str, port: int) -> str:
        """The rank-0 pod's address in `node`'s block ('' where its pods have no namespaces)."""
        held = self._held.get(node)
        if self.settings is None or held is None or not self._ready.get(node):
            return ""
        return gang_address_in(node_subnet(self.settings.pod_network, held[1]), port)

    def sync(self, table: Mapping[str, RayNode], agent: Callable[[str], Any],
             network_slots: Mapping[str, int]) -> list[tuple[str, str, Any]]:
        """Hand blocks to the machines that joined, take back those of the machines that left,
        send each agent its plan where it changed, and take the agents' answers. `network_slots`:
        the block each node's last description says its agent uses (-1: none). Returns (node,
        machine, description) of each answer taken. Called by the monitor only."""
        with self._lock:
            return self._sync(table, agent, network_slots)

    def _sync(self, table: Mapping[str, RayNode], agent: Callable[[str], Any],
              network_slots: Mapping[str, int]) -> list[tuple[str, str, Any]]:
        if not self.on or self.settings is None:
            return []
        alive = {name: node for name, node in table.items() if node.alive}
        for name, (machine, _slot) in list(self._held.items()):
            if name in alive and alive[name].node_id == machine:
                continue
            if name not in alive:  # it left: its block is free again (a new join takes its own over)
                try:
                    self.blocks.release(name, machine)
                except GpupoolError as exc:
                    log.warning("node %s left, but its pod network block was not given back: %s", name, exc)
                    continue
            del self._held[name]
            self._sent.pop(name, None)
            self._ready.pop(name, None)
        capacity = blocks_in(self.settings.pod_network)
        for name, node in alive.items():
            if name not in self._held:
                try:
                    self._held[name] = (node.node_id, self.blocks.assign(name, node.node_id, capacity))
                except GpupoolError as exc:
                    log.warning("node %s: no block of the pod network: %s", name, exc)
        peers = tuple(sorted((name, slot, alive[name].ip) for name, (_m, slot) in self._held.items()))
        machines = tuple(sorted((name, machine) for name, (machine, _s) in self._held.items()))
        if not self.servers:
            self.servers = server_addresses()
        now = time.monotonic()
        for name, (machine, slot) in self._held.items():
            plan = NetworkPlan(self.settings, self.published, slot, peers, machines, self.servers)
            sent = self._sent.get(name)
            restarted = (sent is not None and sent.ref is None and self._ready.get(name)
                         and network_slots.get(name, slot) != slot and now - sent.at >= RESEND_S)
            if sent is not None and sent.plan == plan and not restarted:
                continue
            try:
                handle = agent(name)
            except GpupoolError:
                continue  # its agent is not up yet
            self._sent[name] = _Sent(machine, plan, handle.use_network.remote(plan), now)
        return self._answers()

    def _answers(self) -> list[tuple[str, str, Any]]:
        pending = {name: sent for name, sent in self._sent.items() if sent.ref is not None}
        if not pending:
            return []
        ready, _ = ray.wait([s.ref for s in pending.values()], num_returns=len(pending), timeout=0)
        done = set(ready)
        answers = []
        for name, sent in pending.items():
            if sent.ref not in done:
                continue
            try:
                description = ray.get(sent.ref, timeout=0)
            except (ray.exceptions.RayError, TimeoutError) as exc:
                log.warning("node %s did not take its pod network plan (%s); sent again", name,
                            type(exc).__name__)
                del self._sent[name]
                continue
            sent.ref = None
            self._ready[name] = description.network_slot >= 0
            answers.append((name, sent.machine, description))
        return answers

    def wait(self, node: str, timeout_s: float) -> None:
        """Wait until `node`'s agent has answered the plan sent to it (a launch right after a join)."""
        sent = self._sent.get(node)
        if sent is not None and sent.ref is not None:
            ray.wait([sent.ref], timeout=timeout_s)


def server_addresses() -> tuple[str, ...]:
    """The server's addresses its router and probes connect from: this machine's, as Ray knows it
    (the address the nodes know it by); () when it is not an IPv4 address."""
    try:
        return (str(ipaddress.IPv4Address(ray.util.get_node_ip_address())),)
    except ValueError:
        return ()
