"""Telemetry maths: per-port Gb/s, error increments and congestion from two counter samples; link health."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpupool.core.fabric.model import Fabric, Link

ERROR_COUNTERS = ("symbol_error", "link_downed", "port_rcv_errors")
BYTES_PER_DATA_WORD = 4  # port_xmit_data / port_rcv_data count 32-bit words


@dataclass(frozen=True)
class CounterSample:
    """One reading of a port's counters at `time_s` (None where the port has no PMA value)."""

    node: str
    port: int
    time_s: float
    counters: Mapping[str, int | None]
    rate_gbps: float | None = None


@dataclass(frozen=True)
class PortLoad:
    node: str
    port: int
    xmit_gbps: float
    rcv_gbps: float
    utilization: float
    errors: dict[str, int] = field(default_factory=dict)
    xmit_wait_per_s: float = 0.0
    counter_reset: bool = False

    @property
    def sick(self) -> bool:
        return any(self.errors.values())


def _delta(before: Mapping[str, int | None], after: Mapping[str, int | None], name: str) -> tuple[int, bool]:
    old, new = before.get(name), after.get(name)
    if old is None or new is None:
        return 0, False
    if new < old:  # the counter was cleared (perfquery -x -r, driver reload): count from zero
        return new, True
    return new - old, False


def port_load(before: CounterSample, after: CounterSample) -> PortLoad:
    """Rates between two samples of one port; a cleared counter counts from zero."""
    if (before.node, before.port) != (after.node, after.port):
        raise ValueError("samples must be of the same port")
    elapsed = after.time_s - before.time_s
    if elapsed <= 0:
        raise ValueError("the second sample must be taken after the first")
    xmit, reset_x = _delta(before.counters, after.counters, "port_xmit_data")
    rcv, reset_r = _delta(before.counters, after.counters, "port_rcv_data")
    wait, reset_w = _delta(before.counters, after.counters, "port_xmit_wait")
    errors = {}
    for name in ERROR_COUNTERS:
        errors[name], _ = _delta(before.counters, after.counters, name)
    xmit_gbps = xmit * BYTES_PER_DATA_WORD * 8 / elapsed / 1e9
    rcv_gbps = rcv * BYTES_PER_DATA_WORD * 8 / elapsed / 1e9
    rate = after.rate_gbps or before.rate_gbps
    utilization = min(1.0, max(xmit_gbps, rcv_gbps) / rate) if rate else 0.0
    return PortLoad(
        after.node, after.port, xmit_gbps, rcv_gbps, utilization, errors, wait / elapsed,
        reset_x or reset_r or reset_w,
    )


def apply_loads(fabric: Fabric, loads: Mapping[tuple[str, int], PortLoad]) -> Fabric:
    """Mark links with errors as unhealthy and set each link's utilisation from its busier end.

    Routing then leaves sick links out and prefers paths with bandwidth to spare.
    """
    updated: list[Link] = []
    for link in fabric.links:
        ends = [loads.get((link.a, link.a_port)), loads.get((link.b, link.b_port))]
        seen = [load for load in ends if load is not None]
        if not seen:
            continue
        updated.append(
            replace(
                link,
                utilization=max(load.utilization for load in seen),
                healthy=link.healthy and not any(load.sick for load in seen),
            )
        )
    return fabric.with_links(updated)
