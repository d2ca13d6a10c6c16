"""A tenant's Unix account changed while the scheduler places its work: no pod runs as an account
other than the one its tenant is mapped to.

The change is refused while the tenant has pods that have not ended (services/tenants.py), a count
made in the change's transaction. The scheduler resolves the account of the pods it places (read
in its own transaction, which then writes the pods): on PostgreSQL, where the two run at once, the
change made between that read and the pods' commit counted no pod and committed, and the pods were
launched as the account the tenant had just left, free to be mapped to another tenant. Each test
holds the scheduler's transaction right after its read of the accounts and makes the change there,
the same interleaving on every run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text

from gpupool.api.tenants import TenantCreate, TenantUpdate
from gpupool.api.workloads import WorkloadSpec
from gpupool.config import parse_config
from gpupool.errors import Conflict
from gpupool.pods import PodLaunch
from gpupool.providers.fake import FakeProvider
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops import applier as applier_module
from gpupool.server.loops.control import ControlLoop
from gpupool.server.orm import PodRow, TenantRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import tenants, workloads
from gpupool.server.settings import Settings
from gpupool.server.states import ACTIVE_POD_STATES, PodState

ADMIN = Principal("admin", None)
TENANT = "mapped"
ACCOUNT = "mapped-account"
"""The fake provider runs no process, so the mapping needs no account on this machine."""
WAITING = text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
               "AND datname = current_database()")


class Recording(FakeProvider):
    """The fake provider, keeping every launch it was handed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.launches: list[PodLaunch] = []

    def launch(self, pod: PodLaunch) -> None:
        self.launches.append(pod)
        super().launch(pod)


@pytest.fixture
def rt(tmp_path: Path, db_url: str) -> Iterator[Runtime]:
    now = 1_000_000.0
    settings = Settings(data_dir=tmp_path, database_url=db_url, cycle_interval_s=0.05)
    provider = Recording("1x8xH100", clock=lambda: now)
    made = Runtime(settings=settings, store=Store.open(db_url), provider=provider, clock=lambda: now,
                   config=parse_config("scheduling: {placement: first-fit}\n"))
    tenants.bootstrap(made)
    tenants.create_tenant(made, ADMIN, TenantCreate.model_validate({"name": TENANT}))
    with made.store.write() as session:  # mapped as the admin maps it, less the check of the host's accounts
        row = session.get(TenantRow, TENANT)
        assert row is not None
        row.unix_user = ACCOUNT
    yield made
    made.store.close()


def _remap(rt: Runtime, outcome: list[str]) -> None:
    try:
        tenants.update_tenant(rt, ADMIN, TENANT, TenantUpdate.model_validate({"unix_user": None}))
        outcome.append("changed")
    except Conflict as exc:
        outcome.append(f"refused: {exc}")


def _done_or_waiting(rt: Runtime, url: str, thread: threading.Thread) -> None:
    """Return once `thread` has ended or waits on a lock this thread's transaction holds (PostgreSQL:
    a row lock, as the database reports it; SQLite: the store's one write lock, which it cannot pass
    until this transaction ends, so it is given a moment to reach it)."""
    deadline = time.monotonic() + 30
    if rt.store.is_sqlite:
        thread.join(0.3)
        return
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as watch:
            while thread.is_alive() and not watch.execute(WAITING).scalar():
                assert time.monotonic() < deadline, "the change neither ended nor waited"
                time.sleep(0.01)
    finally:
        engine.dispose()


@pytest.mark.parametrize("when", ["after", "before"])
def test_an_account_changed_while_its_tenants_pods_are_placed_is_refused_or_theirs(
        rt: Runtime, db_url: str, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """Changed right after the scheduler's read of the accounts, the change waits for the pods'
    commit and is refused; changed right before it, the pods get the new account."""
    workload_id = workloads.submit(rt, Principal("tenant", TENANT), WorkloadSpec.model_validate(
        {"command": ["train"], "resources": {"gpus": 1}})).id
    read_accounts = applier_module.unix_users
    outcome: list[str] = []
    raced: list[threading.Thread] = []

    def remap_there(conn: Any, names: set[str]) -> dict[str, str | None]:
        accounts = read_accounts(conn, names) if when == "after" else None
        if TENANT in names and not raced:  # the pods not yet committed
            raced.append(threading.Thread(target=_remap, args=(rt, outcome)))
            raced[0].start()
            _done_or_waiting(rt, db_url, raced[0])
        return read_accounts(conn, names) if accounts is None else accounts

    monkeypatch.setattr(applier_module, "unix_users", remap_there)
    ControlLoop(rt).step()
    assert raced, "the scheduler placed the tenant's work"
    raced[0].join(60)
    assert not raced[0].is_alive(), "the change never ended"

    with rt.store.read() as session:
        mapped = session.scalar(select(TenantRow.unix_user).where(TenantRow.name == TENANT))
        unended = set(session.scalars(select(PodRow.id).where(
            PodRow.workload_id == workload_id,
            PodRow.status.in_((*ACTIVE_POD_STATES, PodState.STOPPING.value)))))
    provider = rt.provider
    assert isinstance(provider, Recording)
    [launch] = provider.launches
    assert launch.pod_id in unended
    assert launch.unix_user == (mapped or ""), (
        f"the pod runs as {launch.unix_user!r} while its tenant is mapped to {mapped!r}: {outcome}")
    if when == "after" or rt.store.is_sqlite:  # (SQLite: the change waits for the whole step)
        assert outcome and outcome[0].startswith(f"refused: Tenant {TENANT!r} has 1 pod(s) not ended yet"), \
            outcome
        assert mapped == ACCOUNT
    else:
        assert outcome == ["changed"]
        assert mapped is None
