"""API models for tenants, their queues (with quotas) and their bearer tokens."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from gpupool.api.common import Name, Strict

UnixUser = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[A-Za-z_][A-Za-z0-9._-]*\$?$",
                                description="an existing account on the server machine, never root")]
# strict: a JSON true/false is refused instead of being read as 1/0 (found by the API fuzzer)
MaxPriority = Annotated[int, Field(ge=-1000, le=1000, strict=True,
                                   description="the highest priority its tokens may submit at")]
MaxPending = Annotated[int, Field(ge=0, le=10_000_000, strict=True,
                                  description="how many of its workloads may wait at once")]
BudgetAmount = Annotated[float, Field(ge=0, le=1e12, strict=True, allow_inf_nan=False,
                                      description="its spend per period, in the price book's currency")]
BudgetPeriodName = Literal["month", "week", "day"]
BudgetWarn = Annotated[float, Field(gt=0, le=1, strict=True, allow_inf_nan=False,
                                    description="the fraction of its budget at which it is warned")]
TokenName = Annotated[str, Field(max_length=63, pattern=r"^[A-Za-z0-9._-]*$")]


class TenantCreate(Strict):
    name: Name
    unix_user: UnixUser | None = Field(None, description="the Unix account its pods run as")
    max_priority: MaxPriority = 0
    max_pending: MaxPending = 10_000


class TenantUpdate(Strict):
    """Only the fields given change; `unix_user: null` removes the mapping."""

    unix_user: UnixUser | None = None
    max_priority: MaxPriority | None = None
    max_pending: MaxPending | None = None
    budget: BudgetAmount | None = Field(default=None, description="null removes the budget")
    budget_period: BudgetPeriodName | None = Field(default=None, description="null leaves it as it is")
    budget_warn: BudgetWarn | None = Field(default=None, description="null leaves it as it is")
    overdraft: bool | None = Field(default=None, description="new work starts even with the budget spent")


class TenantDeleted(Strict):
    name: str
    workloads: int = Field(description="its finished workloads removed from the store (usage stays)")
    accounts_removed: list[str] = Field(description="the pool's Unix accounts of it removed from the nodes")


class TenantOut(Strict):
    name: str
    created_s: float
    queues: list[str]
    max_priority: int = 0
    max_pending: int = 10_000
    unix_user: str | None = None
    budget: float | None = Field(default=None, description="what it may spend per period; null: no budget")
    budget_period: BudgetPeriodName = "month"
    budget_warn: float = 0.8
    overdraft: bool = False
    spent: float | None = Field(default=None, description="spent this period at the prices in force")
    currency: str | None = Field(default=None, description="the price book's, of `budget` and `spent`")
    spent_ratio: float | None = Field(default=None, description="spent / budget")
    period_start_s: float | None = Field(default=None, description="when this budget period began (UTC)")
    budget_exhausted: bool = Field(default=False, description="its new work waits for the next period")
    warning: str | None = Field(default=None, description="one sentence to show the caller (create only)")


Devices = Annotated[float, Field(ge=0, le=1_000_000, strict=True, allow_inf_nan=False,
                                  description="devices (0.5 = half of one)")]
Weight = Annotated[float, Field(gt=0, le=1_000_000, strict=True, allow_inf_nan=False,
                                description="its tenant's fair-share weight under DRF ordering")]


class QueueCreate(Strict):
    tenant: Name
    name: Name
    quota_gpus: Devices | None = Field(None, description="devices its admitted work may hold (nominal); "
                                                         "null = no cap")
    cohort: Name | None = Field(None, description="queues of one cohort lend each other unused quota")
    borrowing_limit_gpus: Devices | None = Field(
        None, description="how far beyond its quota it may borrow from its cohort; null = no limit")
    lending_limit_gpus: Devices | None = Field(
        None, description="how much of its unused quota its cohort may borrow; null = all of it")
    weight: Weight = 1.0


class QueueUpdate(Strict):
    """Only the fields given change; null removes the quota, the cohort or a limit."""

    quota_gpus: Devices | None = None
    cohort: Name | None = None
    borrowing_limit_gpus: Devices | None = None
    lending_limit_gpus: Devices | None = None
    weight: Weight | None = Field(None, description="null leaves it as it is")


class QueueOut(Strict):
    tenant: str
    name: str
    quota_gpus: float | None = Field(description="nominal quota; null = no cap")
    cohort: str | None = None
    borrowing_limit_gpus: float | None = None
    lending_limit_gpus: float | None = None
    weight: float = 1.0
    used_gpus: float = Field(description="held by its running work (pods launching, waiting or running)")
    borrowed_gpus: float = Field(0.0, description="held beyond its quota, lent by its cohort")
    lent_gpus: float = Field(0.0, description="of its unused quota, held by others of its cohort")
    pending: int
    running: int
    reserved_workload: str | None = Field(
        None, description="under backfill: the pending workload the pool holds room for")
    reserved_start_s: float | None = Field(None, description="when that workload is expected to start")


class TokenCreate(Strict):
    tenant: Name | None = Field(None, description="the tenant it acts for; null makes an admin token")
    name: TokenName = Field("", description="unique among the tenant's tokens; empty: named by its id")
    scope: Literal["full", "metrics", "federation"] = Field("full", description=(
        "metrics: may read /metrics only; the admin's tokens only (it names every tenant's use); "
        "federation: a federation hub's token, admin only: submits, reads and cancels work on behalf "
        "of the tenant named in X-Gpupool-On-Behalf-Of, reads usage and the pool's summary"))
    expires_in_s: float | None = Field(
        None, gt=0, le=100 * 365 * 86400, strict=True,
        description="lifetime; null: the server's default (90 days)")
    never_expires: bool = False

    @model_validator(mode="after")
    def _one_lifetime(self) -> TokenCreate:
        if self.never_expires and self.expires_in_s is not None:
            raise ValueError("give expires_in_s or never_expires, not both")
        return self


class TokenInfo(Strict):
    """A token as listed: never its secret nor its hash."""

    id: str
    tenant: str | None
    name: str
    scope: str
    created_s: float
    expires_s: float | None
    last_used_s: float | None
    revoked_s: float | None


class TokenOut(TokenInfo):
    token: str = Field(description="shown once; only its hash is stored")
