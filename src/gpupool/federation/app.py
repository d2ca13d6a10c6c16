"""A federation hub's server: the pool's app over the hub's own store (tenants, tokens, audit) with
the hub's workload routes in front, and no nodes of its own."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI

from gpupool.core.model import Node
from gpupool.errors import ProviderError
from gpupool.federation.calls import calls_router
from gpupool.federation.config import FederationConfig
from gpupool.federation.hub import Hub
from gpupool.federation.routes import hub_router
from gpupool.pods import PodLaunch, PodStatus
from gpupool.providers.base import Provider
from gpupool.server.app import create_app
from gpupool.server.runtime import Runtime


class NoNodes(Provider):
    """A hub runs nothing itself: its work runs on the member pools."""

    name = "federation"

    def nodes(self) -> list[Node]:
        return []

    def launch(self, pod: PodLaunch) -> None:
        raise ProviderError(f"A federation hub has no nodes to run pod {pod.pod_id} on.")

    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        del pod_id, grace_s

    def poll(self) -> list[PodStatus]:
        return []


@dataclass
class HubServer:
    app: FastAPI
    hub: Hub
    notices: list[str]


def create_hub(rt: Runtime, config: FederationConfig) -> HubServer:
    """The hub's app over `rt` (whose provider is NoNodes); members polled once, threads not started."""
    hub = Hub(rt.store, config, clock=rt.clock)
    notices = hub.first_poll()
    routes = hub_router(hub)
    routes.include_router(calls_router(hub))
    app = create_app(rt, run_loop=False, hub_router=routes)
    app.state.hub = hub
    return HubServer(app=app, hub=hub, notices=notices)
