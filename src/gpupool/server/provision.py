"""Choose and build the provider a server runs on: real devices, or a clearly labelled simulation.

With the local provider and a simulated pool of several nodes, each simulated node gets its own
local agent (its own state directory), so pods really run on this machine while the scheduler
sees the simulated nodes and devices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.model import Node
from gpupool.errors import InvalidInput, NotFound, ProviderError
from gpupool.providers.base import Capability, LogChunk, PodLaunch, PodStatus, Provider
from gpupool.server.settings import DEFAULT_SIMULATED_POOL, Settings

MAX_LOCAL_SIMULATED_NODES = 16
"""Above this many simulated nodes (e.g. an OpenB node file) pods are simulated, not executed."""


@dataclass(frozen=True, slots=True)
class Provisioned:
    provider: Provider
    notice: str
    """One line for the operator ('' when there is nothing to say)."""


class LocalPool(Provider):
    """Several simulated nodes, each served by its own local agent on this machine."""

    name = "local"

    concurrent_launch = True
    """launch() may be called from several threads at once (each member's agent is thread-safe)."""

    def __init__(self, nodes: Sequence[Node], state_dir: Path) -> None:
        from gpupool.providers.local import LocalProvider

        self._members: dict[str, LocalProvider] = {}
        for node in nodes:
            if not node.devices:
                raise InvalidInput(f"Simulated node {node.name!r} has no devices.")
            spec = f"{len(node.devices)}x{node.devices[0].model}"
            self._members[node.name] = LocalProvider(state_dir / node.name, simulate=spec,
                                                     node_name=node.name)

    def missing_capabilities(self) -> dict[Capability, str]:
        first = next(iter(self._members.values()))
        missing = dict(first.missing_capabilities())
        missing.pop(Capability.MULTI_NODE, None)
        return missing

    def nodes(self) -> list[Node]:
        return [n for member in self._members.values() for n in member.nodes()]

    def launch(self, pod: PodLaunch) -> None:
        member = self._members.get(pod.node)
        if member is None:
            raise ProviderError(f"Unknown node {pod.node!r}; this pool has {', '.join(self._members)}.")
        member.launch(pod)

    def add_exit_listener(self, listener: Callable[[], None]) -> None:
        for member in self._members.values():
            member.add_exit_listener(listener)

    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        for member in self._members.values():
            member.stop(pod_id, grace_s)

    def poll(self) -> list[PodStatus]:
        return [s for member in self._members.values() for s in member.poll()]

    def read_log(self, pod_id: str, stream: str = "stdout", offset: int = 0) -> LogChunk:
        for member in self._members.values():
            try:
                return member.read_log(pod_id, stream, offset)
            except NotFound:
                continue
        raise NotFound(f"No pod {pod_id!r} on this pool.")

    def close(self) -> None:
        for member in self._members.values():
            member.close()


def provision(settings: Settings) -> Provisioned:
    """The provider `settings` ask for; with no accelerator and no --simulate, a simulated pool."""
    state_dir = settings.data_dir / "agents"
    if settings.provider == "fake":
        import time

        from gpupool.providers.fake import FakeProvider

        spec = settings.simulate or DEFAULT_SIMULATED_POOL
        return Provisioned(FakeProvider(spec, clock=time.time),
                           f"Fake provider: simulated pool {spec}; pods are simulated, nothing runs.")
    if settings.provider != "local":
        from gpupool.providers.registry import make_provider

        return Provisioned(make_provider(settings.provider), "")
    if settings.simulate:
        return _simulated(settings.simulate, state_dir, f"Serving the simulated pool {settings.simulate}")
    from gpupool.providers.local import LocalProvider

    local = LocalProvider(state_dir / "local")
    if any(not d.simulated for n in local.nodes() for d in n.devices):
        return Provisioned(local, "")
    reason = local.missing_capabilities().get(Capability.GPU, "no accelerator found")
    local.close()
    return _simulated(
        DEFAULT_SIMULATED_POOL, state_dir,
        f"No GPU found ({reason.removeprefix('no real accelerator: ')}); serving a SIMULATED pool of "
        f"{DEFAULT_SIMULATED_POOL} (marked simulated everywhere; choose another with --simulate SPEC)",
    )


def _simulated(spec: str, state_dir: Path, notice: str) -> Provisioned:
    from gpupool.providers.fake import nodes_from_spec

    nodes = nodes_from_spec(spec)
    if len(nodes) > MAX_LOCAL_SIMULATED_NODES:
        import time

        from gpupool.providers.fake import FakeProvider

        return Provisioned(FakeProvider(nodes, clock=time.time),
                           f"{notice}: {len(nodes)} nodes, too many to run locally, so pods are simulated.")
    return Provisioned(LocalPool(nodes, state_dir), f"{notice}; pods run as processes on this machine.")
