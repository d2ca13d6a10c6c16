"""The budget gauges at /metrics: each budgeted tenant's spend this period as a fraction of its budget,
and whether its new work waits (read from the server's `BudgetTracker`, refreshed when due)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.server.runtime import Runtime


class BudgetCollector(Collector):
    """gpupool_tenant_budget_spent_ratio{tenant} and gpupool_tenant_budget_exhausted{tenant}."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        spend = self.rt.budgets.spent(self.rt)
        exhausted = self.rt.budgets.exhausted
        ratio = GaugeMetricFamily("gpupool_tenant_budget_spent_ratio",
                                  "A tenant's spend this budget period over its budget (1 = spent).",
                                  labels=["tenant"])
        out = GaugeMetricFamily("gpupool_tenant_budget_exhausted",
                                "1 while a tenant's new work waits because its budget is spent.",
                                labels=["tenant"])
        for tenant in sorted(spend):
            ratio.add_metric([tenant], spend[tenant].ratio)
            out.add_metric([tenant], float(tenant in exhausted))
        yield ratio
        yield out
