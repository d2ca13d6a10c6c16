"""Tenants (limits, Unix account), their queues and quotas; plus the first-start bootstrap."""

from __future__ import annotations

import dataclasses
import getpass
import os
from collections import Counter

from sqlalchemy import Connection, delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.agent.identity import account_name, is_pool_account, mapped_account
from gpupool.api.tenants import (
    QueueCreate,
    QueueOut,
    QueueUpdate,
    TenantCreate,
    TenantDeleted,
    TenantOut,
    TenantUpdate,
)
from gpupool.core.model import WorkloadStatus
from gpupool.core.quota import devices_milli
from gpupool.core.units import MILLI
from gpupool.errors import Conflict, GpupoolError, InvalidInput, NotFound, did_you_mean
from gpupool.server.auth import Principal, new_token
from gpupool.server.orm import (
    EventRow,
    HistoryRow,
    PodRow,
    QueueRow,
    RemoteCallRow,
    RemoteSessionRow,
    SecretRow,
    TenantRow,
    TokenRow,
    WorkloadRow,
)
from gpupool.server.runtime import Runtime
from gpupool.server.services import audit, budgets, metering, quotas, usage_rollup
from gpupool.server.services.converters import milli_to_gpus
from gpupool.server.services.tokens import lock_tenant, token_row, write_private_file
from gpupool.server.states import ACTIVE_POD_STATES, PodState

DEFAULT_TENANT = "default"
DEFAULT_QUEUE = quotas.DEFAULT_QUEUE
_ACTIVE = (WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)
_UNENDED_PODS = (*ACTIVE_POD_STATES, PodState.STOPPING.value)
"""Pods that hold, or may still hold, processes of their tenant's account."""


def bootstrap(rt: Runtime) -> str | None:
    """Create the default tenant and queue, the configuration's queues, and the admin token on first start.

    The admin token (which never expires) is written to DATA_DIR/admin-token (0600) before its
    hash is committed, so a crash leaves either both or a file that the next start replaces.
    Returns the admin token when it was created now, else None. The configuration's queues are
    applied first (`quotas.apply_config_queues`: created, with their tenants, or brought in line).
    """
    quotas.apply_config_queues(rt)
    now = rt.clock()
    with rt.store.write() as session:
        if session.get(TenantRow, DEFAULT_TENANT) is None:
            session.add(TenantRow(name=DEFAULT_TENANT, created_s=now))
            session.flush()
        if session.get(QueueRow, (DEFAULT_TENANT, DEFAULT_QUEUE)) is None:
            session.add(QueueRow(tenant=DEFAULT_TENANT, name=DEFAULT_QUEUE, created_s=now))
        has_admin = session.scalars(select(TokenRow.id).where(TokenRow.tenant.is_(None))).first()
        if has_admin is not None or not rt.settings.create_admin_token:
            return None
        token = new_token()
        write_private_file(rt.settings.admin_token_path, token + "\n")
        session.add(token_row(token, None, "admin", now))
    return token


def server_is_root() -> bool:
    return os.geteuid() == 0


def single_user_warning() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # an account with no name (containers)
        user = f"uid {os.geteuid()}"
    return (f"gpupool runs as {user}, not root, so every pod runs as {user} and tenants are not "
            "isolated from each other; this pool is for that one user.")


def check_unix_user(session: Session, name: str, tenant: str, pool: str = "") -> None:
    """An existing, unprivileged account on this machine (the agent checks it again at launch) that
    no other tenant is mapped to and that is not a pool account (`gpupool-...`, or in the pods'
    group) other than this tenant's own in this pool (`pool`: the pool's id): not another tenant's,
    and not any tenant's of another pool on this machine."""
    identity = mapped_account(name)
    own = account_name(tenant, pool)
    if is_pool_account(identity) and name != own:
        raise InvalidInput(
            f"Unix account {name!r} is a pool account{_whose(session, name, pool)}, not tenant "
            f"{tenant}'s in this pool; map {tenant!r} to an account of its own, or leave it unmapped "
            f"to run its pods as {own!r}.", unix_user=name)
    other = session.scalars(select(TenantRow.name).where(TenantRow.unix_user == name,
                                                         TenantRow.name != tenant)).first()
    if other is not None:
        raise InvalidInput(f"Unix account {name!r} already runs tenant {other}'s pods; give each "
                           "tenant its own account so they cannot reach each other's files.",
                           unix_user=name)


def lock_accounts(session: Session) -> None:
    """The pool-wide lock for mapping tenants to Unix accounts (the default tenant's row, which
    always exists): `check_unix_user` reads every tenant's mapping, so two tenants mapped to one
    account at once must not both pass it; and a change of a mapping waits for the pods being
    written as the account it replaces (`share_accounts`), which it then counts."""
    lock_tenant(session, DEFAULT_TENANT)


_SHARE_ACCOUNTS = (select(TenantRow.name).where(TenantRow.name == DEFAULT_TENANT)
                   .with_for_update(read=True))


def share_accounts(conn: Connection) -> None:
    """Take the lock of `lock_accounts` shared, until the transaction ends (PostgreSQL; SQLite writes
    are serial): a transaction that reads tenants' accounts and writes pods that run as them. A
    change of a mapping then commits either before the read (the pods get the new account) or after
    the pods' commit (and counts them: `_refuse_remap_while_running`), never in between."""
    conn.execute(_SHARE_ACCOUNTS)


def create_tenant(rt: Runtime, who: Principal, body: TenantCreate) -> TenantOut:
    """A new tenant with its `default` queue (no quota)."""
    who.require_admin()
    now = rt.clock()
    try:
        with rt.store.write() as session:
            if session.get(TenantRow, body.name) is not None:
                raise Conflict(f"Tenant {body.name!r} already exists; pick another name.")
            if body.unix_user is not None:
                lock_accounts(session)
                check_unix_user(session, body.unix_user, body.name, rt.settings.pool_id)
            _check_own_account_free(session, body.name, rt.settings.pool_id)
            session.add(TenantRow(name=body.name, created_s=now, max_priority=body.max_priority,
                                  max_pending=body.max_pending, unix_user=body.unix_user))
            session.flush()
            session.add(QueueRow(tenant=body.name, name=DEFAULT_QUEUE, created_s=now))
            audit.record(session, who, "tenant.create", body.name, now, _limits_text(
                body.max_priority, body.max_pending, body.unix_user))
    except IntegrityError:
        raise Conflict(f"Tenant {body.name!r} already exists; pick another name.") from None
    warning = None if body.name == DEFAULT_TENANT or server_is_root() else single_user_warning()
    return TenantOut(name=body.name, created_s=now, queues=[DEFAULT_QUEUE], max_priority=body.max_priority,
                     max_pending=body.max_pending, unix_user=body.unix_user, warning=warning)


def _whose(session: Session, account: str, pool: str) -> str:
    """' (tenant NAME's pods)' when a tenant's pods run as this pool account, else ''."""
    owner = next((t for t in session.scalars(select(TenantRow.name)) if account_name(t, pool) == account),
                 None)
    return "" if owner is None else f" (tenant {owner}'s pods run as it)"


def _check_own_account_free(session: Session, tenant: str, pool: str) -> None:
    """A new tenant's pods run as its pool account: refuse the name when another tenant is mapped to
    that account (a mapping made before the pool refused such mappings)."""
    own = account_name(tenant, pool)
    other = session.scalars(select(TenantRow.name).where(TenantRow.unix_user == own)).first()
    if other is not None:
        raise InvalidInput(f"Tenant {tenant!r} would run its pods as {own!r}, which tenant {other!r} is "
                           f"mapped to; map {other!r} to another account first, or pick another name.",
                           unix_user=own)


def delete_tenant(rt: Runtime, who: Principal, name: str) -> TenantDeleted:
    """Delete a tenant with nothing unfinished: its queues, tokens and finished workloads go from the
    store (their usage stays in the daily rollup, folded first), and the pool's Unix account of it
    from the nodes. Refused (409, with what still runs) while it has unfinished work or pods that
    have not ended; the default tenant is never deleted."""
    from gpupool.server.serving import history as service_history  # (it imports this module)

    who.require_admin()
    if name == DEFAULT_TENANT:
        raise InvalidInput("The default tenant cannot be deleted; it holds the admin's own work.",
                           tenant=name)
    with rt.store.read() as session:
        require_tenant(session, name)
        _refuse_if_busy(session, name)
    # its ended pods' usage is kept before their rows go: all of them, however many other pods wait
    while rt.usage_rollup.fold(rt, tenant=name) == usage_rollup.FOLD_BATCH:
        pass
    try:
        accounts = rt.provider.remove_tenant(name)  # refused while a process still runs as it
    except GpupoolError as exc:
        raise Conflict(f"Tenant {name!r} cannot be deleted yet: {exc.message}", tenant=name) from None
    now = rt.clock()
    try:
        with rt.store.write() as session:
            row = session.get(TenantRow, name, with_for_update=True)
            if row is None:
                require_tenant(session, name)
            _refuse_if_busy(session, name)  # a submission since the first look
            ids = select(WorkloadRow.id).where(WorkloadRow.tenant == name).scalar_subquery()
            conn = session.connection()
            conn.execute(delete(EventRow).where(EventRow.workload_id.in_(ids)))
            metering.retire(session, name, now)  # its pods' usage stays whole for the admin
            conn.execute(delete(PodRow).where(PodRow.workload_id.in_(ids)))
            removed = conn.execute(delete(WorkloadRow).where(WorkloadRow.tenant == name)).rowcount
            conn.execute(delete(TokenRow).where(TokenRow.tenant == name))
            conn.execute(delete(SecretRow).where(SecretRow.tenant == name))
            # its remote functions' sessions and calls (payloads, results): by tenant, not by the
            # workloads above, so one whose workload row is gone goes too; kept, they were readable
            # by id to a tenant made later under the same name
            conn.execute(delete(RemoteCallRow).where(RemoteCallRow.tenant == name))
            conn.execute(delete(RemoteSessionRow).where(RemoteSessionRow.tenant == name))
            conn.execute(delete(QueueRow).where(QueueRow.tenant == name))
            # its services' history (their rows go with the tenant's): kept, a tenant made later under
            # the same name read it on its own service of the same name's page
            conn.execute(delete(HistoryRow).where(
                HistoryRow.series.startswith(service_history.PREFIX, autoescape=True),
                HistoryRow.key.startswith(f"{name}/", autoescape=True)))
            conn.execute(delete(TenantRow).where(TenantRow.name == name))
            audit.record(session, who, "tenant.delete", name, now,
                         f"workloads={removed} accounts={','.join(accounts) or '-'}")
    except IntegrityError:
        raise Conflict(f"Tenant {name!r} was given new work while it was being deleted; cancel it and "
                       "delete the tenant again.", tenant=name) from None
    rt.auth.forget()  # its tokens stop working on every process
    rt.budgets.invalidate()
    return TenantDeleted(name=name, workloads=int(removed or 0), accounts_removed=accounts)


def _unended_pods(session: Session, name: str) -> int:
    """How many of the tenant's pods have not ended (they still run, or are being stopped)."""
    return int(session.scalar(select(func.count()).select_from(PodRow).join(
        WorkloadRow, PodRow.workload_id == WorkloadRow.id).where(
        WorkloadRow.tenant == name, PodRow.status.in_(_UNENDED_PODS))) or 0)


def _refuse_remap_while_running(session: Session, name: str, account: str | None) -> None:
    """Conflict while the tenant has pods that have not ended: they run as the account it is mapped to
    now, and a mapping made free could be given to another tenant, whose work would then run beside
    them as the same account (reading their environments and files)."""
    pods = _unended_pods(session, name)
    if pods:
        runs_as = f"the account {account!r}" if account else "its pool account"
        raise Conflict(f"Tenant {name!r} has {pods} pod(s) not ended yet, running as {runs_as}; its Unix "
                       f"account changes once they have ended (gpupool ls -t {name}, gpupool cancel ID), so "
                       "that no other tenant's work can run as the account they use.",
                       tenant=name, pods=pods)


def _refuse_if_busy(session: Session, name: str) -> None:
    """Conflict when the tenant has unfinished workloads or pods that have not ended yet."""
    unfinished = session.scalar(select(func.count()).select_from(WorkloadRow).where(
        WorkloadRow.tenant == name,
        WorkloadRow.status.not_in([s.value for s in WorkloadStatus if s.is_final]))) or 0
    pods = _unended_pods(session, name)
    if unfinished or pods:
        what = [f"{unfinished} unfinished workload(s)" if unfinished else "",
                f"{pods} pod(s) not ended yet" if pods else ""]
        raise Conflict(f"Tenant {name!r} still has {' and '.join(w for w in what if w)}; cancel its work "
                       f"(gpupool ls -t {name}, gpupool cancel ID) and delete it once its pods have ended.",
                       tenant=name, unfinished=int(unfinished), pods=pods)


def _limits_text(max_priority: int, max_pending: int, unix_user: str | None) -> str:
    return f"max_priority={max_priority} max_pending={max_pending} unix_user={unix_user or '-'}"


def update_tenant(rt: Runtime, who: Principal, name: str, body: TenantUpdate) -> TenantOut:
    """Change the fields given; a tenant's tokens see new limits within a second on every process."""
    who.require_admin()
    given = body.model_fields_set
    with rt.store.write() as session:
        if "unix_user" in given:  # before the mapping is read, and the tenant's pods counted
            lock_accounts(session)
        row = session.get(TenantRow, name)
        if row is None:
            require_tenant(session, name)
        assert row is not None
        if "unix_user" in given and body.unix_user is not None:
            check_unix_user(session, body.unix_user, name, rt.settings.pool_id)
        if "unix_user" in given and (body.unix_user or None) != (row.unix_user or None):
            _refuse_remap_while_running(session, name, row.unix_user)
        if "unix_user" in given:
            row.unix_user = body.unix_user
        if body.max_priority is not None:
            row.max_priority = body.max_priority
        if body.max_pending is not None:
            row.max_pending = body.max_pending
        budget_changed = budgets.apply_update(row, body)
        audit.record(session, who, "tenant.update", name, rt.clock(),
                     _limits_text(row.max_priority, row.max_pending, row.unix_user)
                     + (" " + budgets.describe(row) if budget_changed else ""))
    rt.auth.forget()
    if budget_changed:
        rt.budgets.invalidate()
        rt.capacity_may_have_changed()  # a raised budget or overdraft may let its work start
    return next(t for t in list_tenants(rt, who) if t.name == name)


def list_tenants(rt: Runtime, who: Principal) -> list[TenantOut]:
    spend = rt.budgets.spent(rt)
    exhausted = rt.budgets.exhausted
    currency = rt.config.prices.currency
    with rt.store.read() as session:
        tenants = session.scalars(select(TenantRow).order_by(TenantRow.name)).all()
        queues = session.execute(select(QueueRow.tenant, QueueRow.name).order_by(QueueRow.name)).all()
        by_tenant: dict[str, list[str]] = {}
        for tenant, name in queues:
            by_tenant.setdefault(tenant, []).append(name)
        return [
            TenantOut(name=t.name, created_s=t.created_s, queues=by_tenant.get(t.name, []),
                      max_priority=t.max_priority, max_pending=t.max_pending, unix_user=t.unix_user,
                      **budgets.fields_out(t, spend.get(t.name), t.name in exhausted, currency))
            for t in tenants
            if who.may_see(t.name)
        ]


def made_s(session: Session, name: str) -> float:
    """When tenant `name` was made (0: no such tenant). A tenant's own usage and history start
    there: what a deleted tenant of the same name used, kept under the name, is another's."""
    return float(session.scalar(select(TenantRow.created_s).where(TenantRow.name == name)) or 0.0)


def require_tenant(session: Session, name: str, also: str = "") -> None:
    """NotFound, with the nearest name, unless tenant `name` exists (`also`: a clause said after the
    name, as ", and no usage under that name in the window")."""
    if session.get(TenantRow, name) is None:
        names = list(session.scalars(select(TenantRow.name)).all())
        raise NotFound(f"No tenant named {name!r}{also}.{did_you_mean(name, names)}", tenant=name)


def create_queue(rt: Runtime, who: Principal, body: QueueCreate) -> QueueOut:
    """A new queue with its quota settings; wakes the scheduler (a cohort may have more to lend)."""
    who.require_admin()
    quota = quotas.QueueQuota(
        tenant=body.tenant, name=body.name, quota_milli=_milli(body.quota_gpus), cohort=body.cohort or "",
        borrowing_limit_milli=_milli(body.borrowing_limit_gpus),
        lending_limit_milli=_milli(body.lending_limit_gpus), weight=body.weight)
    quota.check()
    now = rt.clock()
    try:
        with rt.store.write() as session:
            require_tenant(session, body.tenant)
            if session.get(QueueRow, (body.tenant, body.name)) is not None:
                raise Conflict(f"Queue {quota.key} already exists; change it with `gpupool queue set`.")
            row = QueueRow(tenant=body.tenant, name=body.name, created_s=now)
            quotas.set_row(row, quota)
            session.add(row)
            audit.record(session, who, "queue.create", quota.key, now, quotas.describe(quota))
    except IntegrityError:
        raise Conflict(f"Queue {quota.key} already exists; change it with `gpupool queue set`.") from None
    rt.capacity_may_have_changed()
    return _queue_outs(rt, who, tenant=body.tenant, name=body.name)[0]


def update_queue(rt: Runtime, who: Principal, tenant: str, name: str, body: QueueUpdate) -> QueueOut:
    """Change the settings given (null clears a quota, cohort or limit); running work keeps running
    under a lowered quota (only preemption reclaims it); wakes the scheduler."""
    who.require_admin()
    with rt.store.write() as session:
        # locked: two updates each valid alone (a lower quota, a higher lending limit) must not both
        # be checked against the row before either and stored as an invalid pair
        row = session.get(QueueRow, (tenant, name), with_for_update=True)
        if row is None:
            require_tenant(session, tenant)
            raise NotFound(f"No queue {tenant}/{name}; create it with `gpupool queue create`.",
                           tenant=tenant, queue=name)
        quota = _updated(quotas.row_quota(row), body)
        quota.check()
        quotas.set_row(row, quota)
        audit.record(session, who, "queue.update", quota.key, rt.clock(), quotas.describe(quota))
    rt.capacity_may_have_changed()
    return _queue_outs(rt, who, tenant=tenant, name=name)[0]


def _updated(quota: quotas.QueueQuota, body: QueueUpdate) -> quotas.QueueQuota:
    """`quota` with the fields `body` gives (a null weight leaves the weight as it is)."""
    given = body.model_fields_set
    return dataclasses.replace(
        quota,
        quota_milli=_milli(body.quota_gpus) if "quota_gpus" in given else quota.quota_milli,
        cohort=(body.cohort or "") if "cohort" in given else quota.cohort,
        borrowing_limit_milli=(_milli(body.borrowing_limit_gpus) if "borrowing_limit_gpus" in given
                               else quota.borrowing_limit_milli),
        lending_limit_milli=(_milli(body.lending_limit_gpus) if "lending_limit_gpus" in given
                             else quota.lending_limit_milli),
        weight=quota.weight if body.weight is None else body.weight,
    )


def _milli(gpus: float | None) -> int | None:
    return None if gpus is None else devices_milli(gpus)


def list_queues(rt: Runtime, who: Principal, tenant: str | None) -> list[QueueOut]:
    if tenant is not None and not who.may_see(tenant):
        raise NotFound(f"No tenant named {tenant!r}.", tenant=tenant)
    return _queue_outs(rt, who, tenant=tenant or who.tenant)


def _queue_outs(rt: Runtime, who: Principal, tenant: str | None, name: str | None = None) -> list[QueueOut]:
    """The queues asked for, with their use (cohort accounting needs every queue, so all are read)."""
    with rt.store.read() as session:
        conn = session.connection()
        settings = quotas.read_queues(conn)
        use = quotas.queue_use(quotas.quota_config(settings), rt.held.read(conn).milli_by_queue)
        counts = conn.execute(
            select(WorkloadRow.tenant, WorkloadRow.queue, WorkloadRow.status, func.count())
            .where(WorkloadRow.status.in_((WorkloadStatus.PENDING.value, *_ACTIVE)))
            .group_by(WorkloadRow.tenant, WorkloadRow.queue, WorkloadRow.status)
        ).all()
        reserved = conn.execute(
            select(WorkloadRow.tenant, WorkloadRow.queue, WorkloadRow.id, WorkloadRow.reserved_start_s)
            .where(WorkloadRow.status == WorkloadStatus.PENDING.value,
                   WorkloadRow.reserved_start_s.is_not(None))
            .order_by(WorkloadRow.reserved_start_s.desc(), WorkloadRow.id.desc())
        ).all()
    number: Counter[tuple[str, str, str]] = Counter()
    for t, q, status, count in counts:
        number[(t, q, status)] += int(count)
    heads = {(t, q): (wid, start_s) for t, q, wid, start_s in reserved}  # the earliest start wins
    outs = []
    for s in sorted(settings, key=lambda s: (s.tenant, s.name)):
        if (tenant is not None and s.tenant != tenant) or (name is not None and s.name != name):
            continue
        if not who.may_see(s.tenant):
            continue
        held = use.get(s.key, quotas.QueueUse())
        head = heads.get((s.tenant, s.name))
        outs.append(QueueOut(
            tenant=s.tenant, name=s.name, quota_gpus=milli_to_gpus(s.quota_milli), cohort=s.cohort or None,
            borrowing_limit_gpus=milli_to_gpus(s.borrowing_limit_milli),
            lending_limit_gpus=milli_to_gpus(s.lending_limit_milli), weight=s.weight,
            used_gpus=held.used_milli / MILLI, borrowed_gpus=held.borrowed_milli / MILLI,
            lent_gpus=held.lent_milli / MILLI,
            pending=number[(s.tenant, s.name, WorkloadStatus.PENDING.value)],
            running=sum(number[(s.tenant, s.name, st)] for st in _ACTIVE),
            reserved_workload=head[0] if head else None, reserved_start_s=head[1] if head else None,
        ))
    return outs
