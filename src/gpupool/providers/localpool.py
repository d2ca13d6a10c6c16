"""A simulated pool of several nodes on this machine: one local agent (LocalProvider) per node.

Pods really run here while the scheduler sees the simulated nodes and devices; faults can be
injected into any of them. Each member has its own state directory and, where pods get network
namespaces, its own slot of the pod network (a /19, a gateway device and host routes: a gang spread
over members meets through this machine's routing, agent/netns.py); when pods run as other accounts
the members share the pods' scratch root, and so one checkpoint directory per workload.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpupool.agent.execs import ExecSession
from gpupool.agent.identity import Identities
from gpupool.agent.netns import NetworkSettings
from gpupool.agent.runner import DEFAULT_MAX_LOG_BYTES
from gpupool.core.model import Node
from gpupool.errors import InvalidInput, NotFound, ProviderError
from gpupool.pods import HealthEvent, LogChunk, PodLaunch, PodStatus
from gpupool.providers.base import Capability, DeviceReading, Provider
from gpupool.providers.local import LocalProvider


class LocalPool(Provider):
    """Several simulated nodes, each served by its own local agent on this machine."""

    name = "local"

    concurrent_launch = True
    """launch() may be called from several threads at once (each member's agent is thread-safe)."""

    def __init__(self, nodes: Sequence[Node], state_dir: Path, *,
                 max_log_bytes: int = DEFAULT_MAX_LOG_BYTES, network: NetworkSettings | None = None,
                 published: Sequence[tuple[str, int]] = (), identities: Identities | None = None,
                 guarded: Sequence[Path] = ()) -> None:
        identities = identities or Identities()  # one for all members: one account per tenant
        for node in nodes:
            if not node.devices:
                raise InvalidInput(f"Simulated node {node.name!r} has no devices.")

        def member(slot: int, node: Node) -> LocalProvider:
            spec = f"{len(node.devices)}x{node.devices[0].model}"
            # each member its own slot of the pod network (its own /19, gateway and routes)
            return LocalProvider(state_dir / node.name, simulate=spec, node_name=node.name,
                                 max_log_bytes=max_log_bytes, network=network, network_slot=slot,
                                 published=published, identities=identities, guarded=guarded)

        # Opened side by side: each mostly waits on its network's commands and its pods' records
        # (a new leader opens the pool again at its takeover: bench/failover.py)
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(nodes)))) as pool:
            futures = [pool.submit(member, slot, node) for slot, node in enumerate(nodes)]
        opened = [f.result() for f in futures if f.exception() is None]
        failed = next((f.exception() for f in futures if f.exception() is not None), None)
        if failed is not None:
            for provider in opened:
                provider.close()
            raise failed
        self._members: dict[str, LocalProvider] = {n.name: m for n, m in zip(nodes, opened, strict=True)}

    def _member(self, node: str) -> LocalProvider:
        member = self._members.get(node)
        if member is None:
            raise NotFound(f"No node {node!r} in this pool; it has {', '.join(self._members)}.")
        return member

    def missing_capabilities(self) -> dict[Capability, str]:
        first = next(iter(self._members.values()))
        missing = dict(first.missing_capabilities())
        missing.pop(Capability.MULTI_NODE, None)
        return missing

    def nodes(self) -> list[Node]:
        return [n for member in self._members.values() for n in member.nodes()]

    def device_readings(self) -> dict[tuple[str, int], DeviceReading]:
        return {key: reading for member in self._members.values()
                for key, reading in member.device_readings().items()}

    def gang_address(self, node: str, port: int) -> str:
        member = self._members.get(node)
        return member.gang_address(node, port) if member is not None else self.node_address(node)

    def pod_address(self, node: str, pod_id: str) -> str:
        member = self._members.get(node)
        return member.pod_address(node, pod_id) if member is not None else self.node_address(node)

    def launch(self, pod: PodLaunch) -> None:
        member = self._members.get(pod.node)
        if member is None:
            raise ProviderError(f"Unknown node {pod.node!r}; this pool has {', '.join(self._members)}.")
        member.launch(pod)

    def fence(self, epoch: int, confirm: Callable[[], None] | None = None) -> None:
        for member in self._members.values():
            member.fence(epoch, confirm)

    def add_exit_listener(self, listener: Callable[[], None]) -> None:
        for member in self._members.values():
            member.add_exit_listener(listener)

    def remove_tenant(self, tenant: str) -> list[str]:
        removed: list[str] = []  # the members share their accounts: the first removes it
        for member in self._members.values():
            removed += [name for name in member.remove_tenant(tenant) if name not in removed]
        return removed

    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        for member in self._members.values():
            member.stop(pod_id, grace_s)

    def poll(self) -> list[PodStatus]:
        return [s for member in self._members.values() for s in member.poll()]

    def forget_pods(self, pod_ids: Sequence[str]) -> None:
        for member in self._members.values():  # each ignores the ids it does not know
            member.forget_pods(pod_ids)

    def read_log(self, pod_id: str, stream: str = "stdout", offset: int = 0) -> LogChunk:
        for member in self._members.values():
            try:
                return member.read_log(pod_id, stream, offset)
            except NotFound:
                continue
        raise NotFound(f"No pod {pod_id!r} on this pool.")

    def exec(self, node: str, pod_id: str, command: Sequence[str], *, pty: bool = False, rows: int = 0,
             cols: int = 0) -> ExecSession:
        return self._member(node).exec(node, pod_id, command, pty=pty, rows=rows, cols=cols)

    def inject_fault(self, node: str, device_uuid: str = "", reason: str = "injected fault") -> None:
        self._member(node).inject_fault(node, device_uuid, reason)

    def clear_fault(self, node: str, device_uuid: str = "") -> None:
        self._member(node).clear_fault(node, device_uuid)

    def health_events(self) -> list[HealthEvent]:
        events = [e for member in self._members.values() for e in member.health_events()]
        return sorted(events, key=lambda e: e.time_s)  # stable: a member's own order is kept

    def checkpoint_s(self, workload_id: str) -> float | None:
        marks = [member.checkpoint_s(workload_id) for member in self._members.values()]
        return max((m for m in marks if m is not None), default=None)

    def _checkpoint_roots(self) -> list[LocalProvider]:
        """One member per distinct checkpoint root (one in all where the members share it)."""
        return list({member.agent.checkpoints.root: member for member in self._members.values()}.values())

    def read_checkpoint(self, workload_id: str, max_bytes: int) -> tuple[float | None, bytes] | None:
        found = [c for m in self._checkpoint_roots() if (c := m.read_checkpoint(workload_id, max_bytes))]
        return max(found, key=lambda c: c[0] or 0.0, default=None)  # the latest where it ran

    def seed_checkpoint(self, workload_id: str, tenant: str, unix_user: str, data: bytes, *,
                        on_behalf: bool = False) -> int:
        return max(m.seed_checkpoint(workload_id, tenant, unix_user, data, on_behalf=on_behalf)
                   for m in self._checkpoint_roots())

    def forget_workload(self, workload_id: str) -> None:
        for member in self._members.values():
            member.forget_workload(workload_id)

    def close(self, *, stop_pods: bool = False) -> None:
        """Close every member (see LocalProvider.close). Idempotent."""
        for member in self._members.values():
            member.close(stop_pods=stop_pods)
