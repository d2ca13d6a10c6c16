"""API models for the pool's history (GET /history): the dashboard's charts over 1 h, 24 h and 7 d."""

from __future__ import annotations

from pydantic import Field

from gpupool.api.common import Strict


class HistorySeries(Strict):
    name: str = Field(description="capacity, allocated or pending (devices), or a tenant's name")
    values: list[tuple[float, float]] = Field(description="[bucket start (epoch s), mean devices]")


class DeviceHistory(Strict):
    node: str
    index: int
    simulated: bool = Field(description="a simulated device: its utilisation is never measured")
    allocated: float = Field(description="the mean share of the device allocated over the range (0-1)")
    busy_pct: float | None = Field(description="the mean utilisation NVML measured (percent); "
                                               "null where not measured")
    memory_used_mib: float | None = Field(description="the mean memory used as NVML measured it")


class HistoryOut(Strict):
    metric: str
    range: str
    step_s: int = Field(description="the width of one point: 60 (1h), 300 (24h), 3600 (7d)")
    since_s: float
    now_s: float
    series: list[HistorySeries]
    devices: list[DeviceHistory] = Field(description="metric=devices: each device's means over the range")
