"""API models of the live fabric: `GET /api/v1/fabric` (topology, link state and load, a gang's
path), link changes (fail, heal, telemetry) and a placement's place in the fabric."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpupool.api.common import Strict


class LevelOut(Strict):
    level: int = Field(description="0 for leaf switches (hosts attach there), then one more per tier up")
    tier: str = Field(description="leaf, spine or core (a third level and above)")
    switches: int


class SwitchOut(Strict):
    id: str = Field(description="the topology file's id of the switch")
    name: str = Field(description="its name (node-name-map, else its description, else its id)")
    level: int | None = Field(description="its fat-tree level; null when not reachable from a leaf")


class PortOut(Strict):
    hca: str = Field(description="the adapter's device name (mlx5_0)")
    port: int
    adapter: str = Field(description="the adapter's name in the fabric, as `links` name their ends "
                                     "(its cable is the link with this adapter and port at one end)")
    leaf: str = Field(description="the name of the leaf switch it is cabled to")
    rail: int = Field(description="its rail on a rail-optimised fabric (the host's k-th adapter), else 0")


class FabricNodeOut(Strict):
    node: str = Field(description="the pool's node")
    host: str = Field(description="the fabric host it was mapped to (docs/network-aware.md: mapping)")
    leaf: str = Field(description="its leaf domain: the leaf switch (or, on rails, the leaves joined by +)")
    spine: str = Field(description="its spine group: the leaves that share a spine switch")
    ports: list[PortOut]


class LinkOut(Strict):
    id: str = Field(description="NODE:PORT of the cable's first end; `fabric fail-link` takes either end")
    a: str = Field(description="name of one end (switch or adapter)")
    a_port: int
    b: str
    b_port: int
    kind: str = Field(description="access (a host's adapter to its leaf) or switch (between switches)")
    width_speed: str = Field(description="e.g. 4xHDR")
    data_rate_gbps: float
    failed: bool = Field(description="failed by an admin (fabric fail-link) or by telemetry (link_downed)")
    degraded: bool = Field(description="trained below the fabric's usual width or speed")
    load: float = Field(description="last measured load, 0..1 of its data rate (telemetry)")
    available_gbps: float = Field(description="data rate left by the load; 0 when failed")
    gangs: int = Field(description="running gangs whose routes use it (every tenant's, counted only)")


class GangPathOut(Strict):
    workload_id: str
    nodes: list[str] = Field(description="its pods' nodes in rank order")
    domain: str = Field(description="the narrowest tier holding all its nodes: node, leaf, spine or fabric")
    hops: int = Field(description="the most cables between two of its nodes (2 under one leaf)")
    connected: bool = Field(description="false when two of its nodes have no route left")
    bottleneck: str | None = Field(description="id of its slowest cable (LinkOut.id); null on one node")
    bottleneck_gbps: float | None = Field(description=(
        "that cable's bandwidth left by its load, shared by the gangs routed over it; null on one node"))
    links: list[str] = Field(description="ids of every cable its routes use")


class FabricOut(Strict):
    """The fabric the pool runs on, for people and the dashboard (read-only for tenants)."""

    source: str = Field(description="the file the server was started with (--fabric)")
    levels: list[LevelOut]
    switches: list[SwitchOut]
    nodes: list[FabricNodeOut] = Field(description="the pool's nodes and where they sit")
    links: list[LinkOut]
    gang: GangPathOut | None = Field(None, description=(
        "with ?workload=ID: that workload's path (a tenant may ask only for its own)"))


class NetworkOut(Strict):
    """Where a running gang sits in the fabric (in `GET /workloads/{id}` when a fabric is known)."""

    domain: str = Field(description="node, leaf, spine or fabric: the narrowest tier holding all its nodes")
    hops: int = Field(description="the most cables between two of its nodes")
    bottleneck: str | None = Field(description="its slowest cable (NODE:PORT of one end)")
    bottleneck_gbps: float | None = Field(description="its bandwidth left, shared by the gangs on it")
    connected: bool


PortRef = Annotated[str, Field(min_length=3, max_length=300, description="NODE:PORT, one end of a cable")]


class LinkRequest(Strict):
    link: PortRef


class PortSample(Strict):
    """One port's load and errors from the fabric's counters (e.g. perfquery on the SM host)."""

    node: str = Field(min_length=1, max_length=255, description="switch or adapter: id, name, GUID or LID")
    port: int = Field(ge=0, le=255)
    utilization: float = Field(ge=0, le=1, description="busier direction's data rate over the port's")
    errors: dict[Annotated[str, Field(max_length=64)], Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, description="counter increments since the last sample (link_downed fails it)")


class TelemetryIn(Strict):
    ports: list[PortSample] = Field(min_length=1, max_length=100_000)


class LinkChangeOut(Strict):
    links: list[str] = Field(description="the cables that changed (failed now, for telemetry)")
    changed: bool = Field(description="false when the link already was in that state")
    requeued: list[str] = Field(description="gangs cut off (some of their nodes lost every route): requeued")
    congested: list[str] = Field(default_factory=list, description=(
        "gangs whose bottleneck is above fabric.congestion_threshold at this sample "
        "(fabric.migrate_on_congestion: the scheduler moves those congested for congestion_for)"))
    slowed: dict[str, str] = Field(description="gang -> the event naming its new bottleneck")
