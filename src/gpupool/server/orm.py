"""SQLAlchemy table models: tenants, queues, tokens, workloads, pods, events, node flags, audit and
remote calls.

Rows never leave the services; `services/converters.py` turns them into API schemas.
Times are float seconds since the epoch (`*_s`); a workload's spec is JSON beside indexed columns.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ID_LENGTH = 64
NAME_LENGTH = 63
UNIX_USER_LENGTH = 32


class Base(DeclarativeBase):
    pass


class TenantRow(Base):
    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    created_s: Mapped[float] = mapped_column(Float)
    max_priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """The highest priority its tokens may submit at (the admin token is not limited)."""
    max_pending: Mapped[int] = mapped_column(Integer, default=10_000, server_default="10000")
    """How many of its workloads may wait at once (Slurm's MaxSubmitJobs)."""
    unix_user: Mapped[str | None] = mapped_column(String(UNIX_USER_LENGTH), nullable=True)
    """The Unix account its pods run as when the agent runs as root; NULL: the pool's own account."""
    budget: Mapped[float | None] = mapped_column(Float, nullable=True)
    """What it may spend per budget period, in the price book's currency; NULL: no budget."""
    budget_period: Mapped[str] = mapped_column(String(8), default="month", server_default="month")
    budget_warn: Mapped[float] = mapped_column(Float, default=0.8, server_default="0.8")
    """The fraction of its budget at which it is warned (once per period)."""
    budget_overdraft: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    """Whether its new work still starts once its budget is spent (it is only warned)."""


class QueueRow(Base):
    """A tenant's local queue; `quota_device_milli` caps what its admitted work may hold."""

    __tablename__ = "queues"

    tenant: Mapped[str] = mapped_column(
        String(NAME_LENGTH), ForeignKey("tenants.name", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    quota_device_milli: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_s: Mapped[float] = mapped_column(Float)
    cohort: Mapped[str] = mapped_column(String(NAME_LENGTH), default="", server_default="")
    """Queues of one cohort lend each other their unused quota (Kueue's cohort)."""
    borrowing_limit_milli: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """How much beyond its quota it may borrow from its cohort; NULL: as much as is lent."""
    lending_limit_milli: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """How much of its unused quota its cohort may borrow; NULL: all of it."""
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    """Its tenant's share weight under DRF ordering."""


class TokenRow(Base):
    """A bearer token, stored only as its SHA-256; `tenant` is NULL for admin tokens.

    `scope` is "full" or "metrics" (may read /metrics only); `expires_s` NULL never expires;
    a revoked token keeps its row (with `revoked_s`) so listings and the audit can name it.
    """

    __tablename__ = "tokens"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    tenant: Mapped[str | None] = mapped_column(
        String(NAME_LENGTH), ForeignKey("tenants.name", ondelete="CASCADE"), nullable=True
    )
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), default="")
    created_s: Mapped[float] = mapped_column(Float)
    scope: Mapped[str] = mapped_column(String(16), default="full", server_default="full")
    expires_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_used_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class WorkloadRow(Base):
    __tablename__ = "workloads"
    __table_args__ = (
        ForeignKeyConstraint(["tenant", "queue"], ["queues.tenant", "queues.name"]),
        Index("ix_workloads_status_order", "status", "priority", "submit_s"),
        Index("ix_workloads_tenant_status", "tenant", "status"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), default="")
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH))
    queue: Mapped[str] = mapped_column(String(NAME_LENGTH))
    status: Mapped[str] = mapped_column(String(16))
    priority: Mapped[int] = mapped_column(Integer, default=0)
    device_milli: Mapped[int] = mapped_column(BigInteger, default=0)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(String(1024), default="")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    submit_s: Mapped[float] = mapped_column(Float)
    admitted_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    started_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    array_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), nullable=True, index=True)
    """The array this workload is one task of (`gpupool submit --array`), NULL for a lone workload."""
    array_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    array_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """How many tasks of its array may hold slices at once (`--array 0-99%10`); NULL: no limit."""
    retries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Requeues after pod failures so far (bounded by the spec's max_retries)."""
    not_before_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    """A requeued workload is not placed before this time (requeue backoff)."""
    time_limit_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Its pods are stopped this long after it started (`--time-limit`); NULL: no limit."""
    reserved_start_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Under backfill: when the head of the queue is expected to start (its reservation)."""
    progress_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    """Work kept from earlier runs (up to its last checkpoint), seconds."""
    lost_device_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    """Device-seconds of work lost to preemptions and evictions (after the last checkpoint)."""
    run_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    """Seconds it ran in earlier attempts (its attained service is run_s x devices)."""
    held: Mapped[str] = mapped_column(String(8), default="", server_default="")
    """'' (not held), 'user' or 'admin' (`gpupool hold`): a held workload is not read for a cycle."""
    waiting_on: Mapped[str] = mapped_column(String(1024), default="", server_default="")
    """The part of its --dependency that does not hold yet ('' once it does): not read for a cycle."""
    revision: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """How often its spec was updated while pending: an admission expects the revision it placed."""


class PodRow(Base):
    """One pod of one attempt of a workload; written before the provider is asked to launch it."""

    __tablename__ = "pods"
    __table_args__ = (Index("ix_pods_status", "status"), Index("ix_pods_finished_s", "finished_s"))

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    workload_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("workloads.id", ondelete="CASCADE"), index=True
    )
    attempt: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    rank: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    node: Mapped[str] = mapped_column(String(255))
    slices: Mapped[list[dict[str, int]]] = mapped_column(JSON)
    cpu_milli: Mapped[int] = mapped_column(BigInteger, default=0)
    memory_mib: Mapped[int] = mapped_column(BigInteger, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    message: Mapped[str] = mapped_column(String(1024), default="")
    created_s: Mapped[float] = mapped_column(Float)
    finished_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    started_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    """When the provider started it (NULL: never started); its slices are metered from then to
    `finished_s` (or now, while it runs)."""
    models: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    """Each slice's device as at launch ({model, device_memory_mib, simulated}, in the order of
    `slices`), so its usage is priced by that model even after the node leaves (NULL: written
    before revision 0006; metered with the devices listed now)."""
    rolled_up: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0", index=True)
    """Its usage is in usage_daily (set once it ended and the rollup folded it)."""
    epoch: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """The leader's epoch it was written under (server/leader.py; NULL: a single server)."""


class RetiredPodRow(Base):
    """The metered interval of a pod of a deleted tenant (`gpupool tenant delete`), kept when its pod
    and workload rows go: what metering reads of a pod (services/metering.py), so the tenant's usage
    stays in the admin's queries and invoices, for any window and after a change of prices rebuilds
    the rollup. Nothing of its command, environment or output is kept."""

    __tablename__ = "retired_pods"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH), index=True)
    queue: Mapped[str] = mapped_column(String(NAME_LENGTH))
    priority_class: Mapped[str] = mapped_column(String(NAME_LENGTH))
    """As its workload's spec stored it ('' when none: the default class then)."""
    service: Mapped[str] = mapped_column(String(NAME_LENGTH))
    """The service it was a replica of ('' for other work)."""
    node: Mapped[str] = mapped_column(String(255))
    slices: Mapped[list[dict[str, int]]] = mapped_column(JSON)
    models: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    started_s: Mapped[float] = mapped_column(Float)
    finished_s: Mapped[float] = mapped_column(Float)
    rolled_up: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0", index=True)
    retired_s: Mapped[float] = mapped_column(Float)
    """When its tenant was deleted."""


class UsageDailyRow(Base):
    """The metered usage of the ended pods marked `rolled_up`, one row per UTC day,
    tenant, queue, priority class, node, device model and simulated mark (services/usage_rollup.py)."""

    __tablename__ = "usage_daily"

    day_s: Mapped[float] = mapped_column(Float, primary_key=True)
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    queue: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    priority_class: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    node: Mapped[str] = mapped_column(String(255), primary_key=True)
    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    simulated: Mapped[bool] = mapped_column(Boolean, primary_key=True)
    compute_milli_s: Mapped[float] = mapped_column(Float)
    memory_mib_s: Mapped[float] = mapped_column(Float)
    cost: Mapped[float] = mapped_column(Float)
    dedicated_cost: Mapped[float] = mapped_column(Float)
    unpriced: Mapped[int] = mapped_column(Integer)
    """Pieces with no price (a row with any is `priced: false`)."""
    pods: Mapped[int] = mapped_column(Integer)
    """Pods with a piece in this row; the other counts let distinct pods be counted when days or
    models are summed (see usage_rollup.py)."""
    pods_carried: Mapped[int] = mapped_column(Integer)
    pods_first_model: Mapped[int] = mapped_column(Integer)
    pods_carried_first_model: Mapped[int] = mapped_column(Integer)
    pods_first: Mapped[int] = mapped_column(Integer)
    pods_carried_first: Mapped[int] = mapped_column(Integer)


class UsageDailyServiceRow(Base):
    """usage_daily keyed by the service a pod was a replica of too ('' for other work): what the
    rollup writes and reads since 0014 (an invoice has a line per service); usage_daily is the last
    release's, left as it was."""

    __tablename__ = "usage_daily_services"

    day_s: Mapped[float] = mapped_column(Float, primary_key=True)
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    queue: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    priority_class: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    node: Mapped[str] = mapped_column(String(255), primary_key=True)
    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    simulated: Mapped[bool] = mapped_column(Boolean, primary_key=True)
    service: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    compute_milli_s: Mapped[float] = mapped_column(Float)
    memory_mib_s: Mapped[float] = mapped_column(Float)
    cost: Mapped[float] = mapped_column(Float)
    dedicated_cost: Mapped[float] = mapped_column(Float)
    unpriced: Mapped[int] = mapped_column(Integer)
    pods: Mapped[int] = mapped_column(Integer)
    pods_carried: Mapped[int] = mapped_column(Integer)
    pods_first_model: Mapped[int] = mapped_column(Integer)
    pods_carried_first_model: Mapped[int] = mapped_column(Integer)
    pods_first: Mapped[int] = mapped_column(Integer)
    pods_carried_first: Mapped[int] = mapped_column(Integer)


class UsageRollupStateRow(Base):
    """The rollup's one state row: the pods marked `rolled_up` are in usage_daily_services (the last
    release's: usage_daily), priced by the price
    book whose digest is `prices_sha256` (another digest: rebuilt)."""

    __tablename__ = "usage_rollup_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    prices_sha256: Mapped[str] = mapped_column(String(64))


class EventRow(Base):
    """One state transition of a workload (or one of its pods), with a reason and a time."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    workload_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("workloads.id", ondelete="CASCADE"), index=True
    )
    pod_id: Mapped[str] = mapped_column(String(ID_LENGTH), default="")
    from_status: Mapped[str] = mapped_column(String(16), default="")
    to_status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(String(1024), default="")
    at_s: Mapped[float] = mapped_column(Float)


class NodeFlagRow(Base):
    """What an admin decided about a node (cordoned, draining); the provider says what exists."""

    __tablename__ = "node_flags"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    draining: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_s: Mapped[float] = mapped_column(Float)
    failed: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    """An injected fault took the whole node down (simulated and fake nodes only)."""
    failed_devices: Mapped[list[int]] = mapped_column(JSON, default=list, server_default="[]")
    """Device indexes an injected fault took down."""


class AuditRow(Base):
    """One admin action or refused authentication: who (`actor`, `token_id`), what, when, from where.

    `actor` is "admin", a tenant name, or "" when nobody was authenticated (auth.refused rows,
    which are coalesced: `count` refusals from one address for one reason within a minute).
    """

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    at_s: Mapped[float] = mapped_column(Float, index=True)
    actor: Mapped[str] = mapped_column(String(NAME_LENGTH), default="")
    token_id: Mapped[str] = mapped_column(String(ID_LENGTH), default="")
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(255), default="")
    detail: Mapped[str] = mapped_column(String(1024), default="")
    remote: Mapped[str] = mapped_column(String(64), default="")
    count: Mapped[int] = mapped_column(Integer, default=1)


class RemoteSessionRow(Base):
    """A function workload's session (`gpupool.connect().session()`, or one `remote()` call): the
    calls its worker pod serves. Its id is the workload's id."""

    __tablename__ = "remote_sessions"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH))
    one_shot: Mapped[bool] = mapped_column(Boolean, default=False)
    """Its worker stops after its first call (`remote()`): a fresh slice per call."""
    closed: Mapped[bool] = mapped_column(Boolean, default=False)
    """No more calls come: its worker stops once the queued ones are answered."""
    idle_timeout_s: Mapped[float] = mapped_column(Float)
    last_active_s: Mapped[float] = mapped_column(Float)
    """The last call submitted or answered; idle past idle_timeout_s, its worker stops."""
    pod_id: Mapped[str] = mapped_column(String(ID_LENGTH), default="")
    """The pod that last asked for calls; calls a former pod held are offered again to a new one."""
    python: Mapped[str] = mapped_column(String(16))
    created_s: Mapped[float] = mapped_column(Float)


class RemoteCallRow(Base):
    """One call of a remote function: its pickled input until answered, then its pickled result."""

    __tablename__ = "remote_calls"
    __table_args__ = (Index("ix_remote_calls_session_status", "session_id", "status"),
                      Index("ix_remote_calls_finished_s", "finished_s"))

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    session_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("remote_sessions.id", ondelete="CASCADE"))
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH))
    status: Mapped[str] = mapped_column(String(16))
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    result: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    error: Mapped[str] = mapped_column(String(1024), default="")
    traceback: Mapped[str] = mapped_column(Text, default="")
    pod_id: Mapped[str] = mapped_column(String(ID_LENGTH), default="")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    submitted_s: Mapped[float] = mapped_column(Float)
    started_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class RemoteKeyRow(Base):
    """The key that signs pods' call tokens (one row, made on first use; shared by server processes)."""

    __tablename__ = "remote_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    secret: Mapped[str] = mapped_column(String(128))
    created_s: Mapped[float] = mapped_column(Float)


class SecretRow(Base):
    """One of a tenant's secrets: its keys' values sealed together (server/secretbox.py), never in
    the clear; `keys` lists their names (they are not secret)."""

    __tablename__ = "secrets"

    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    keys: Mapped[list[str]] = mapped_column(JSON)
    sealed: Mapped[bytes] = mapped_column(LargeBinary)
    created_s: Mapped[float] = mapped_column(Float)
    updated_s: Mapped[float] = mapped_column(Float)
    revision: Mapped[int] = mapped_column(Integer, default=0)
    """Counts replacements: a replace writes only over the revision it read (compare-and-set)."""
class HistoryRow(Base):
    """One point of the pool's history (services/history.py): `series` at the bucket starting `at_s`,
    `step_s` long (60: one minute; 3600: an hour rolled up from its minutes), for `key` (a tenant, a
    device as NODE/INDEX, or '' for the pool). The primary key makes every write idempotent: a minute
    sampled twice (two servers, a restart) is inserted once, the second insert ignored."""

    __tablename__ = "history"
    __table_args__ = ({"sqlite_with_rowid": False},)
    """The key is the row (SQLite WITHOUT ROWID): no second copy of it in an index; half the bytes."""

    series: Mapped[str] = mapped_column(String(16), primary_key=True)
    step_s: Mapped[int] = mapped_column(Integer, primary_key=True)
    at_s: Mapped[float] = mapped_column(Float, primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[float] = mapped_column(Float)
    """allocated, capacity: milli-GPUs; pending: milli-GPUs asked by pending work; tenant: its
    allocated milli-GPUs; device: the device's allocated milli."""
    busy_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    """device rows: utilisation measured by NVML (percent), None where not measured (simulated)."""
    memory_mib: Mapped[float | None] = mapped_column(Float, nullable=True)
    """device rows: memory used as NVML measures it, None where not measured."""


# ---- federation hub (src/gpupool/federation): a hub's own record of the work it placed on members
class FedWorkloadRow(Base):
    """A workload submitted to a federation hub: the truth about where it runs. Every change is a
    compare-and-set on `version`, so two hub threads (or servers) never both move or place it."""

    __tablename__ = "fed_workloads"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    gpus: Mapped[float] = mapped_column(Float)
    """What it asks for in all (replicas x GPUs per pod): the federation-wide quota counts it."""
    state: Mapped[str] = mapped_column(String(16), index=True)
    """queued (to be offered), placed (a member holds it), done (ended there), cancelled."""
    member: Mapped[str | None] = mapped_column(String(NAME_LENGTH), nullable=True)
    member_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), nullable=True)
    status: Mapped[str] = mapped_column(String(16))
    """The member's status of its copy as last read (pending before it is placed)."""
    view: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """The member's copy as last read (GET /workloads/ID), shown under the hub's id."""
    moves: Mapped[int] = mapped_column(Integer, default=0)
    version: Mapped[int] = mapped_column(Integer, default=0)
    submit_s: Mapped[float] = mapped_column(Float)
    updated_s: Mapped[float] = mapped_column(Float)
    held: Mapped[str] = mapped_column(String(16), default="", server_default="")
    """A hold asked at the hub: "user" or "admin" ("" for none). A held workload is not offered, and
    the member's held copy is not released by the hub's watch (as it releases a restarted member's)."""


class FedPlacementRow(Base):
    """Every copy a hub made on a member: current, stale (the hub moved it; cancel it there when the
    member answers) or withdrawn (cancelled there, or found ended)."""

    __tablename__ = "fed_placements"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    workload_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH))
    member: Mapped[str] = mapped_column(String(NAME_LENGTH), index=True)
    member_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    """'' when the offer's answer was lost: found on the member by the hub's id in its env."""
    state: Mapped[str] = mapped_column(String(16))
    at_s: Mapped[float] = mapped_column(Float)


class FedCheckpointRow(Base):
    """The last checkpoint a hub fetched of a workload that declares one (a tar of its checkpoint
    directory on `member`, marked at `mark_s` there): the member that runs it next starts from it."""

    __tablename__ = "fed_checkpoints"

    workload_id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH))
    member: Mapped[str] = mapped_column(String(NAME_LENGTH))
    mark_s: Mapped[float] = mapped_column(Float)
    size: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    at_s: Mapped[float] = mapped_column(Float)


class FedSessionRow(Base):
    """A remote-function session opened through a hub: its id is the member's (its workload there),
    and its calls are forwarded to that member as its tenant."""

    __tablename__ = "fed_sessions"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH))
    member: Mapped[str] = mapped_column(String(NAME_LENGTH))
    at_s: Mapped[float] = mapped_column(Float)


class FedEventRow(Base):
    """A hub's decision about one workload: offered, placed, refused, moved, stale copy cancelled."""

    __tablename__ = "fed_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    workload_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    reason: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text)
    at_s: Mapped[float] = mapped_column(Float)


# ---- inference services (docs/services.md): one block, so other tables merge beside it
class ServiceRow(Base):
    """A tenant's inference service: its spec (api.services.ServiceSpec, as stored), how many replicas
    it should have, and what the controller last saw. `version` counts every write to the row: a write
    that depends on a read states the version it read (compare-and-set); `generation` counts spec
    changes only (a replica of an older generation is rolled over to the new one)."""

    __tablename__ = "services"
    __table_args__ = (Index("ux_services_tenant_name", "tenant", "name", unique=True),)

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH), ForeignKey("tenants.name", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    generation: Mapped[int] = mapped_column(Integer, default=1)
    version: Mapped[int] = mapped_column(Integer, default=1)
    desired: Mapped[int] = mapped_column(Integer)
    min_replicas: Mapped[int] = mapped_column(Integer)
    max_replicas: Mapped[int] = mapped_column(Integer)
    target_concurrency: Mapped[float | None] = mapped_column(Float, nullable=True)
    target_rps: Mapped[float | None] = mapped_column(Float, nullable=True)
    public: Mapped[bool] = mapped_column(Boolean, default=False)
    """Its endpoints answer requests without the tenant's token (the router decides)."""
    state: Mapped[str] = mapped_column(String(16))
    """pending, ready (desired replicas ready), degraded (a replica's probe does not pass), deleting."""
    last_probe_error: Mapped[str] = mapped_column(String(1024), default="")
    created_s: Mapped[float] = mapped_column(Float)
    updated_s: Mapped[float] = mapped_column(Float)


class ServiceReplicaRow(Base):
    """One replica of a service: the workload that runs it, the port reserved for it ($PORT), where it
    answers once placed, and what its probes said."""

    __tablename__ = "service_replicas"

    workload_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("workloads.id", ondelete="CASCADE"), primary_key=True)
    service_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("services.id", ondelete="CASCADE"), index=True)
    generation: Mapped[int] = mapped_column(Integer)
    """The service's spec generation it was created from."""
    port: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(255), default="")
    """Its endpoint's address once its pod runs ('' before)."""
    ready: Mapped[str] = mapped_column(String(16), default="starting")
    """starting (no probe passed yet), ready, unready (readiness failing), failed (liveness failed:
    being replaced), draining (being removed)."""
    successes: Mapped[int] = mapped_column(Integer, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    """Consecutive probe results (reset when the other kind comes)."""
    last_error: Mapped[str] = mapped_column(String(1024), default="")
    created_s: Mapped[float] = mapped_column(Float)
    ready_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class ServiceEventRow(Base):
    """Something that happened to a service: scaled, replica replaced, rollout step, degraded."""

    __tablename__ = "service_events"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    service_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("services.id", ondelete="CASCADE"), index=True)
    reason: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(String(1024))
    at_s: Mapped[float] = mapped_column(Float)


class ServiceTrafficRow(Base):
    """What one server's router saw of one service at its last tick, written by every server but the
    leader once a second (several servers on one store: docs/ha.md); the leader's autoscaler adds the
    fresh rows of the others to its own router's numbers."""

    __tablename__ = "service_traffic"

    server_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    service_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("services.id", ondelete="CASCADE"), primary_key=True)
    in_flight: Mapped[int] = mapped_column(BigInteger)
    requests_total: Mapped[int] = mapped_column(BigInteger)
    """The router's own count since it started (the leader counts what it grew by)."""
    at_s: Mapped[float] = mapped_column(Float)


class LeaderLeaseRow(Base):
    """The one lease of several servers on one store (server/leader.py): who leads, under which
    epoch, until when. Taken and renewed by compare-and-set; a new holder bumps the epoch."""

    __tablename__ = "leader_lease"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    holder: Mapped[str] = mapped_column(String(64))
    epoch: Mapped[int] = mapped_column(BigInteger)
    expires_s: Mapped[float] = mapped_column(Float)
    renewed_s: Mapped[float] = mapped_column(Float)
    acquired_s: Mapped[float] = mapped_column(Float)


class ServerRow(Base):
    """A server on this store and its heartbeat (`gpupool server ls`)."""

    __tablename__ = "servers"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    address: Mapped[str] = mapped_column(String(255))
    version: Mapped[str] = mapped_column(String(64))
    started_s: Mapped[float] = mapped_column(Float)
    seen_s: Mapped[float] = mapped_column(Float)


class NetBlockRow(Base):
    """A machine's block of the pod network (the /19 numbered `slot`, agent/netns.py): handed out
    when the machine joins (a Ray node), given back when it leaves. `slot` and `node` are each
    unique, so two servers handing out blocks at once can never give one block twice."""

    __tablename__ = "net_blocks"

    slot: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String(255), unique=True)
    machine: Mapped[str] = mapped_column(String(64))
    """The join holding it (its Ray node id): a later join of the node takes it over."""
    assigned_s: Mapped[float] = mapped_column(Float)
