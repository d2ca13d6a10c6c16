"""API models for usage and chargeback: metered slice-seconds per group, priced pooled and dedicated."""

from __future__ import annotations

from pydantic import Field

from gpupool.api.common import Strict


class UsageRowOut(Strict):
    """One group's usage; a grouping key not asked for is absent (null)."""

    tenant: str | None = None
    queue: str | None = None
    model: str | None = None
    priority_class: str | None = None
    node: str | None = None
    day: str | None = Field(None, description="UTC date, YYYY-MM-DD")
    service: str | None = Field(None, description="the inference service ('' for other work)")
    simulated: bool = Field(description="usage of simulated devices, metered apart")
    pods: int = Field(description="pod attempts that held slices in this group")
    device_hours: float = Field(description="compute share x hours: a 0.25 slice for 4 h is 1.0")
    memory_gib_hours: float
    cost: float = Field(description="under the price book in force at each interval's time")
    dedicated_cost: float = Field(description="the same work on whole dedicated devices (each pod's "
                                              "devices rounded up)")
    saving: float = Field(description="dedicated_cost - cost")
    priced: bool = Field(description="false when some usage is of a model with no price (costed 0)")


class UsageOut(Strict):
    since_s: float
    until_s: float
    by: list[str]
    currency: str
    rows: list[UsageRowOut]
    total: UsageRowOut
