"""Budgets in a replay: a budgets file, each tenant's spend as the replay meters it (`sim/cost.py`),
the exhausted set handed to the core each cycle (the same `Policies.exhausted_tenants` the server
fills), and how often each tenant's work waited for its budget.

The file (YAML)::

    period: month          # day, week or month (UTC, on the trace's clock); the default for all
    warn: 0.8              # optional
    tenants:
      team-a: 5000         # an amount, or the full terms:
      team-b: {amount: 100, period: day, overdraft: false}
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpupool.core.budgets import Budget, BudgetPeriod, SpendLedger, exhausted, period_end, period_start
from gpupool.core.metering import PodInterval, PriceBook
from gpupool.core.model import Reason
from gpupool.core.scheduling.cycle import Rejection
from gpupool.errors import InvalidInput
from gpupool.sim.cost import CostMeter
from gpupool.yamlfiles import read_text, safe_load


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


Amount = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class TenantBudgetConfig(_Strict):
    amount: Amount
    period: BudgetPeriod | None = None
    warn: float | None = Field(default=None, gt=0, le=1)
    overdraft: bool = False


class BudgetsConfig(_Strict):
    period: BudgetPeriod = BudgetPeriod.MONTH
    warn: float = Field(0.8, gt=0, le=1)
    tenants: dict[str, Amount | TenantBudgetConfig] = Field(default_factory=dict)

    def budgets(self) -> dict[str, Budget]:
        out = {}
        for tenant, terms in self.tenants.items():
            if not isinstance(terms, TenantBudgetConfig):
                terms = TenantBudgetConfig(amount=terms)
            out[tenant] = Budget(terms.amount, terms.period or self.period,
                                 self.warn if terms.warn is None else terms.warn, terms.overdraft)
        return out


def load_budgets(path: Path | str) -> dict[str, Budget]:
    """The tenants' budgets of a budgets file (see the module docstring)."""
    source = Path(path)
    try:
        data: Any = safe_load(read_text(source, "the budgets file"))
    except OSError as exc:
        raise InvalidInput(f"Cannot read the budgets file {source}: {exc.strerror}; check the path.") from exc
    except yaml.YAMLError as exc:
        first_line = str(exc).splitlines()[0]
        raise InvalidInput(f"The budgets file {source} is not valid YAML: {first_line}.") from exc
    try:
        return BudgetsConfig.model_validate(data or {}).budgets()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise InvalidInput(f"The budgets file {source} is invalid at {where}: {first['msg']}.") from exc


class BudgetWatch:
    """Spend per budgeted tenant as the replay runs, and the waits its budget caused."""

    def __init__(self, budgets: Mapping[str, Budget], book: PriceBook) -> None:
        self.budgets = dict(budgets)
        self.ledger = SpendLedger(book)
        self.folded = 0
        """How many of the meter's closed intervals are in the ledger (they close in time order)."""
        self.spent: dict[str, float] = {}
        self.waits: dict[str, int] = dict.fromkeys(self.budgets, 0)
        self.held: dict[str, set[str]] = {t: set() for t in self.budgets}
        self.exhausted_periods: dict[str, set[float]] = {t: set() for t in self.budgets}
        self.warned_periods: dict[str, set[float]] = {t: set() for t in self.budgets}

    def exhausted(self, meter: CostMeter, now_s: float) -> frozenset[str]:
        """The tenants whose spend reached their budget by `now_s`."""
        budgets = self.budgets
        closed = meter.intervals
        for interval in closed[self.folded:]:
            budget = budgets.get(interval.tenant)
            if budget is not None:
                self.ledger.fold(interval, budget)
        self.folded = len(closed)
        self.spent = self.ledger.spent(budgets, _open(meter, budgets, now_s), now_s)
        out = exhausted(budgets, self.spent)
        for tenant, spent in self.spent.items():
            budget = budgets[tenant]
            start = period_start(budget.period, now_s)
            if budget.amount <= 0 or spent >= budget.warn_fraction * budget.amount:
                self.warned_periods[tenant].add(start)
            if tenant in out:
                self.exhausted_periods[tenant].add(start)
        return out

    def count(self, rejected: Sequence[Rejection], tenant_of: Mapping[str, Any]) -> frozenset[str]:
        """Count the cycle's budget waits per tenant (`tenant_of`: workload id -> its Workload); the
        tenants whose work waited."""
        waited = set()
        for r in rejected:
            if r.reason is Reason.BUDGET_EXHAUSTED:
                tenant = tenant_of[r.workload_id].tenant
                self.waits[tenant] += 1
                self.held[tenant].add(r.workload_id)
                waited.add(tenant)
        return frozenset(waited)

    def next_period_s(self, tenants: frozenset[str], now_s: float) -> float:
        """When the first of these tenants' periods ends (their work may start then)."""
        return min(period_end(self.budgets[t].period, now_s) for t in tenants)

    def report(self) -> dict[str, Any]:
        """Per tenant: its terms, its spend in the last period metered, how many cycles its work waited
        for its budget (workload-cycles), how many workloads waited, and in how many periods it was
        warned and exhausted."""
        tenants = {}
        for tenant, budget in sorted(self.budgets.items()):
            tenants[tenant] = {
                "budget": budget.amount, "period": budget.period.value, "overdraft": budget.overdraft,
                "spent_last_period": round(self.spent.get(tenant, 0.0), 4),
                "budget_waits": self.waits[tenant], "workloads_held": len(self.held[tenant]),
                "periods_warned": len(self.warned_periods[tenant]),
                "periods_exhausted": len(self.exhausted_periods[tenant]),
            }
        return {"tenants": tenants, "budget_waits": sum(self.waits.values())}


def _open(meter: CostMeter, budgets: Mapping[str, Budget], now_s: float) -> Iterator[PodInterval]:
    """The budgeted tenants' runs still open, as intervals up to now."""
    for start, w, held in meter.open.values():
        if w.tenant in budgets:
            for rank, (node, slices) in enumerate(held):
                yield PodInterval(f"{w.id}-r{rank}", w.tenant, w.queue, w.priority_class, node, start,
                                  max(now_s, start), slices)
