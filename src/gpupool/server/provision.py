"""Choose and build the provider a server runs on: real devices, or a clearly labelled simulation.

With the local provider and a simulated pool of several nodes, each simulated node gets its own
local agent (its own state directory), so pods really run on this machine while the scheduler
sees the simulated nodes and devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpupool.providers.base import Provider
from gpupool.server.settings import DEFAULT_SIMULATED_POOL, Settings

MAX_LOCAL_SIMULATED_NODES = 16
"""Above this many simulated nodes (e.g. an OpenB node file) pods are simulated, not executed."""


@dataclass(frozen=True, slots=True)
class Provisioned:
    provider: Provider
    notice: str
    """One line for the operator ('' when there is nothing to say)."""
    pool_id: str | None = None
    """The pool id the pods' accounts are named by where it is not the server's own (None): a Ray
    cluster's, published by the first server that connected to it (providers/ray/join.py)."""


def provision(settings: Settings, *, ray_address: str = "") -> Provisioned:
    """The provider `settings` ask for; with no accelerator and no --simulate, a simulated pool.
    `ray_address` (HOST:PORT) attaches the ray provider to a running cluster."""
    state_dir = settings.resolved_agent_dir
    if ray_address and settings.provider != "ray":
        from gpupool.errors import InvalidInput

        raise InvalidInput("--ray-address needs --provider ray.")
    if settings.provider == "ray":
        return _ray(settings, ray_address)
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
        return _simulated(settings.simulate, state_dir, f"Serving the simulated pool {settings.simulate}",
                          settings.max_pod_log_bytes, settings)
    from gpupool.agent.identity import Identities
    from gpupool.agent.netns import NetworkSettings
    from gpupool.providers.local import LocalProvider, devices_here

    # Devices are looked for before any agent starts: an agent takes the pod network's first block
    # and clears what its own pods do not hold, which on a machine without a GPU are the namespaces
    # of the simulated pool's first node, whose pods run on across a restart.
    count, said = devices_here()
    if count:
        local = LocalProvider(state_dir / "local", max_log_bytes=settings.max_pod_log_bytes,
                              network=NetworkSettings.from_env(), published=published_services(settings),
                              identities=Identities(pool_id=settings.pool_id), guarded=(settings.data_dir,))
        if any(not d.simulated for n in local.nodes() for d in n.devices):
            return Provisioned(local, "")
        local.close()
    reason = said or "no accelerator found"
    return _simulated(
        DEFAULT_SIMULATED_POOL, state_dir,
        f"No GPU found ({reason}); serving a SIMULATED pool of "
        f"{DEFAULT_SIMULATED_POOL} (marked simulated everywhere; choose another with --simulate SPEC)",
        settings.max_pod_log_bytes, settings,
    )


def _ray(settings: Settings, address: str) -> Provisioned:
    """The ray provider: on the cluster at `address`, or on a head started here (with one Ray
    worker node per simulated node when --simulate is given)."""
    from gpupool.agent.netns import NetworkSettings
    from gpupool.providers.registry import make_provider

    provider = make_provider("ray", address=address or None, simulate=settings.simulate or None,
                             data_dir=settings.data_dir,  # imports the ray provider, or says what to install
                             network=NetworkSettings.from_env(), published=published_services(settings),
                             pool_id=settings.pool_id)
    from gpupool.providers.ray.provider import RayProvider
    from gpupool.providers.ray.settings import ADDRESS_FILE

    head = provider.address if isinstance(provider, RayProvider) else ""
    cluster_id = provider.pool_id if isinstance(provider, RayProvider) else settings.pool_id
    where = f"the Ray cluster at {head}" if address else f"a Ray head started here at {head}"
    simulated = f", {len(provider.nodes())} simulated node(s) on this machine" if settings.simulate else ""
    return Provisioned(provider, f"Ray provider: {where}{simulated} (address in "
                                 f"{settings.data_dir / ADDRESS_FILE}); join a GPU server with: "
                                 f"gpupool node join --server URL --ray-address {head}",
                       pool_id=cluster_id if cluster_id != settings.pool_id else None)


def published_services(settings: Settings) -> tuple[tuple[str, int], ...]:
    """The pool's services a pod in its own network namespace may reach: the API server, where pods
    reach it (GPUPOOL_POD_API_URL when it names an address, else the listening address; a wildcard
    listens on loopback too)."""
    import ipaddress
    import os
    import urllib.parse

    from gpupool.server.services.calls import POD_URL_ENV

    explicit = os.environ.get(POD_URL_ENV, "").strip()
    host, port = settings.host, settings.port
    if explicit:
        try:
            parts = urllib.parse.urlsplit(explicit)
            host = parts.hostname or host
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            pass
    if host in ("", "0.0.0.0", "localhost"):
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return ()  # a name: the operator declares its network (GPUPOOL_POD_REACHABLE)
    return ((str(address), port),) if address.version == 4 else ()


def _simulated(spec: str, state_dir: Path, notice: str, max_log_bytes: int,
               settings: Settings) -> Provisioned:
    from gpupool.providers.fake import nodes_from_spec

    nodes = nodes_from_spec(spec)
    if len(nodes) > MAX_LOCAL_SIMULATED_NODES:
        import time

        from gpupool.providers.fake import FakeProvider

        return Provisioned(FakeProvider(nodes, clock=time.time),
                           f"{notice}: {len(nodes)} nodes, too many to run locally, so pods are simulated.")
    from gpupool.agent.identity import Identities
    from gpupool.agent.netns import NetworkSettings
    from gpupool.providers.localpool import LocalPool

    return Provisioned(LocalPool(nodes, state_dir, max_log_bytes=max_log_bytes,
                                 network=NetworkSettings.from_env(), published=published_services(settings),
                                 identities=Identities(pool_id=settings.pool_id),
                                 guarded=(settings.data_dir,)),
                       f"{notice}; pods run as processes on this machine.")
