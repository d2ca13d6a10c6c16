"""Choose and build the provider a server runs on: real devices, or a clearly labelled simulation.

With the local provider and a simulated pool of several nodes, each simulated node gets its own
local agent (its own state directory), so pods really run on this machine while the scheduler
sees the simulated nodes and devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpupool.providers.base import Capability, Provider
from gpupool.server.settings import DEFAULT_SIMULATED_POOL, Settings

MAX_LOCAL_SIMULATED_NODES = 16
"""Above this many simulated nodes (e.g. an OpenB node file) pods are simulated, not executed."""


@dataclass(frozen=True, slots=True)
class Provisioned:
    provider: Provider
    notice: str
    """One line for the operator ('' when there is nothing to say)."""


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
    from gpupool.providers.localpool import LocalPool

    return Provisioned(LocalPool(nodes, state_dir), f"{notice}; pods run as processes on this machine.")
