"""Pool accounts belong to one tenant of one pool: `gpupool-<pool id>-<tenant>`, the pool id kept in
the data directory; `--unix-user` refuses any pool account but the tenant's own in this pool; and
`gpupool tenant delete` removes the tenant (and its pool account) only once nothing of it runs."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from conftest import Server
from gpupool.agent import identity
from gpupool.agent.identity import (
    MAX_ACCOUNT_NAME,
    Identities,
    account_name,
    ensure_account,
    remove_account,
)
from gpupool.errors import InvalidInput, ProviderError
from gpupool.server.datadir import pool_id
from gpupool.server.orm import RemoteCallRow, RemoteSessionRow
from gpupool.server.services import tenants as tenants_service

API = "/api/v1"
needs_root = pytest.mark.skipif(not tenants_service.server_is_root(),
                                reason="creates and removes Unix accounts (needs root)")


def test_the_pool_id_is_made_once_kept_private_and_checked(tmp_path: Path) -> None:
    first = pool_id(tmp_path)
    assert len(first) == 6 and first.isalnum() and first == first.lower()
    assert pool_id(tmp_path) == first, "stable across starts"
    assert (tmp_path / "pool-id").stat().st_mode & 0o077 == 0
    (tmp_path / "pool-id").write_text("../../etc\n")
    with pytest.raises(InvalidInput, match=r"not a pool id .* remove it to give this pool a new id"):
        pool_id(tmp_path)


def test_account_names_carry_the_pool_id_and_stay_short() -> None:
    assert account_name("team-a", "1a2b3c") == "gpupool-1a2b3c-team-a"
    assert account_name("team-a") == "gpupool-team-a", "a server without a pool id names them as before"
    long = "a-tenant-name-far-too-long-for-unix"
    one, two = account_name(long, "1a2b3c"), account_name(long, "4d5e6f")
    assert len(one) <= MAX_ACCOUNT_NAME and len(two) <= MAX_ACCOUNT_NAME and one != two
    assert account_name(long + "x", "1a2b3c") != one, "cut names keep a hash of the whole name"


def _submit(server: Server, token: str) -> str:
    answer = server.client.post(f"{API}/workloads", json={"command": ["train"], "resources": {"gpus": 1}},
                                headers=server.headers(token))
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def test_tenant_delete_is_refused_while_its_work_runs_then_removes_it(server_factory: Callable[..., Server],
                                                                     db_url: str) -> None:
    server = server_factory(db_url)
    server.created("/tenants", {"name": "team-a"})
    token = str(server.created("/tokens", {"tenant": "team-a"})["token"])
    running = _submit(server, token)
    server.wait_for(lambda: server.status(running) == "running")
    refused = server.client.delete(f"{API}/tenants/team-a", headers=server.headers())
    assert refused.status_code == 409, refused.text
    message = refused.json()["message"]
    assert "Tenant 'team-a' still has 1 unfinished workload(s)" in message and "gpupool cancel" in message
    assert server.client.delete(f"{API}/tenants/team-a", headers=server.headers(token)).status_code == 403
    server.client.post(f"{API}/workloads/{running}/cancel", headers=server.headers())
    [pod_id] = server.provider.launched
    server.provider.finish(pod_id)  # the provider reports the stopped pod ended
    # the cancelled workload's pod ended: nothing of the tenant runs any more
    server.wait_for(lambda: server.client.delete(f"{API}/tenants/team-a",
                                                 headers=server.headers()).status_code != 409)
    names = [t["name"] for t in server.client.get(f"{API}/tenants", headers=server.headers()).json()]
    assert "team-a" not in names
    assert server.client.get(f"{API}/workloads", headers=server.headers(token)).status_code == 401
    assert server.client.delete(f"{API}/tenants/team-a", headers=server.headers()).status_code == 404
    default = server.client.delete(f"{API}/tenants/default", headers=server.headers())
    assert default.status_code == 422 and "cannot be deleted" in default.json()["message"]


def test_a_deleted_tenants_remote_calls_go_with_it_and_a_new_tenant_of_its_name_reads_none(
        server_factory: Callable[..., Server], db_url: str) -> None:
    server = server_factory(db_url)
    server.client.post(f"{API}/nodes/n0/cordon", headers=server.headers()).raise_for_status()
    server.created("/tenants", {"name": "team-c"})
    token = str(server.created("/tokens", {"tenant": "team-c"})["token"])
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    opened = server.client.post(f"{API}/calls/sessions", json={"python": python, "call": {"payload": "AA=="}},
                                headers=server.headers(token))
    assert opened.status_code == 201, opened.text
    session_id, call_id = opened.json()["id"], opened.json()["call"]["id"]
    server.client.post(f"{API}/workloads/{session_id}/cancel", headers=server.headers()).raise_for_status()
    assert server.client.delete(f"{API}/tenants/team-c", headers=server.headers()).status_code == 200
    with server.rt.store.read() as session:
        for row in (RemoteSessionRow, RemoteCallRow):
            assert session.scalar(select(func.count()).select_from(row).where(row.tenant == "team-c")) == 0
    server.created("/tenants", {"name": "team-c"})  # someone else, later, under the same name
    token = str(server.created("/tokens", {"tenant": "team-c"})["token"])
    assert server.client.get(f"{API}/calls/{call_id}", headers=server.headers(token)).status_code == 404
    assert server.client.get(f"{API}/calls/sessions/{session_id}",
                             headers=server.headers(token)).status_code == 404


def test_tenant_delete_is_refused_while_the_provider_still_sees_its_account_busy(server: Server) -> None:
    server.created("/tenants", {"name": "team-b"})

    def busy(tenant: str) -> list[str]:
        raise ProviderError("1 process(es) still run as the account 'gpupool-x-team-b'; it is removed "
                            "once they have ended.")

    server.rt.provider.remove_tenant = busy  # type: ignore[method-assign]
    answer = server.client.delete(f"{API}/tenants/team-b", headers=server.headers())
    assert answer.status_code == 409 and "1 process(es) still run" in answer.json()["message"]
    names = [t["name"] for t in server.client.get(f"{API}/tenants", headers=server.headers()).json()]
    assert "team-b" in names, "nothing deleted"


@pytest.fixture
def accounts() -> Iterator[list[str]]:
    """Account names to remove after the test."""
    made: list[str] = []
    yield made
    for name in made:
        with contextlib.suppress(ProviderError):
            remove_account(name)


@needs_root
def test_an_accounts_last_process_ending_just_after_is_waited_for_and_one_that_stays_refuses(
        accounts: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod is reported ended once its shim wrote the exit file; the shim, the account's, exits just
    after. Its account's removal right then waits for it (here: the process ends after the first
    count saw it); a process that stays past the grace still refuses it."""
    name = account_name("ending", "t2e3")
    accounts.append(name)
    made = ensure_account(name)
    last = subprocess.Popen(["sleep", "600"], user=made.uid, group=made.gid)
    counted = identity.processes_of
    counts: list[int] = []

    def count_then_end(uid: int) -> int:
        counts.append(counted(uid))
        if len(counts) == 1:
            last.kill()
            last.wait()
        return counts[-1]

    monkeypatch.setattr(identity, "processes_of", count_then_end)
    assert remove_account(name) is True
    assert counts[0] == 1 and counts[-1] == 0
    with pytest.raises(KeyError):
        pwd.getpwnam(name)
    made = ensure_account(name)
    stays = subprocess.Popen(["sleep", "600"], user=made.uid, group=made.gid)
    try:
        monkeypatch.setattr(identity, "processes_of", counted)
        monkeypatch.setattr(identity, "ENDING_GRACE_S", 0.2)
        with pytest.raises(ProviderError, match=f"1 process\\(es\\) still run as the account '{name}'"):
            remove_account(name)
        assert pwd.getpwnam(name).pw_uid == made.uid
    finally:
        stays.kill()
        stays.wait()


@needs_root
def test_two_pools_on_one_machine_never_share_an_account(accounts: list[str]) -> None:
    first = Identities(switch_users=True, pool_id="t0a1")
    second = Identities(switch_users=True, pool_id="t0b2")
    accounts += [account_name("shared", "t0a1"), account_name("shared", "t0b2")]
    one, two = first.resolve("shared"), second.resolve("shared")
    assert one is not None and two is not None
    assert (one.user, two.user) == ("gpupool-t0a1-shared", "gpupool-t0b2-shared")
    assert one.uid != two.uid
    with pytest.raises(InvalidInput, match="the pool's account of another tenant"):
        Identities(switch_users=True, pool_id="t0a1").resolve("shared", two.user)  # the other pool's


@needs_root
def test_unix_user_refuses_another_pools_account_of_the_same_tenant(server: Server,
                                                                   accounts: list[str]) -> None:
    server.rt.settings = dataclasses.replace(server.rt.settings, pool_id="t1a1")
    accounts += [account_name("team-c", "t1b2"), account_name("team-c", "t1a1")]
    theirs = ensure_account(account_name("team-c", "t1b2"))  # team-c of another pool on this machine
    answer = server.client.post(f"{API}/tenants", json={"name": "team-c", "unix_user": theirs.user},
                                headers=server.headers())
    assert answer.status_code == 422, answer.text
    assert "'gpupool-t1b2-team-c' is a pool account" in answer.json()["message"]
    assert "run its pods as 'gpupool-t1a1-team-c'" in answer.json()["message"]
    own = ensure_account(account_name("team-c", "t1a1"))
    created = server.client.post(f"{API}/tenants", json={"name": "team-c", "unix_user": own.user},
                                 headers=server.headers())
    assert created.status_code == 201, created.text


@needs_root
def test_removing_a_pool_account_waits_for_its_processes(accounts: list[str]) -> None:
    identities = Identities(switch_users=True, pool_id="t2a1")
    accounts += [account_name("gone", "t2a1"), account_name("gone", "t2a1", on_behalf=True)]
    identity = identities.resolve("gone")
    others = identities.resolve("gone", on_behalf=True)
    assert identity is not None and others is not None
    assert (identity.user, others.user) == ("gpupool-t2a1-gone", "gpupool-t2a1-gone_ob")
    assert identity.uid != others.uid
    sleeper = subprocess.Popen(["sleep", "60"], user=identity.uid, group=identity.gid)
    try:
        busy = r"1 process\(es\) still run as the account 'gpupool-t2a1-gone'"
        with pytest.raises(ProviderError, match=busy):
            identities.remove("gone")
        pwd.getpwnam(identity.user)  # still there
    finally:
        sleeper.kill()
        sleeper.wait()
    sleeper = subprocess.Popen(["sleep", "60"], user=others.uid, group=others.gid)
    try:  # a process of the on-behalf account keeps both: neither uid is freed while one stays
        with pytest.raises(ProviderError, match="still run as the account 'gpupool-t2a1-gone_ob'"):
            identities.remove("gone")
        assert pwd.getpwnam(identity.user).pw_uid == identity.uid
        assert identities.resolve("gone") == identity, "resolved again, not a freed uid's stale entry"
    finally:
        sleeper.kill()
        sleeper.wait()
    assert identities.remove("gone") == [identity.user, others.user]
    for name in (identity.user, others.user):
        with pytest.raises(KeyError):
            pwd.getpwnam(name)
    assert identities.remove("gone") == [], "idempotent"
    assert os.geteuid() == 0


def test_on_behalf_accounts_are_named_apart_from_every_tenants_own() -> None:
    """Work the admin or a hub started for a tenant runs as `<account>_ob`: no tenant's own account
    can end so (tenant names have no underscore), and a long name is cut to 32 characters with
    both its hash and the suffix kept."""
    assert account_name("team-a", "p1") == "gpupool-p1-team-a"
    assert account_name("team-a", "p1", on_behalf=True) == "gpupool-p1-team-a_ob"
    long = "a" * 40
    own, others = account_name(long, "p1"), account_name(long, "p1", on_behalf=True)
    assert len(own) == len(others) == 32
    assert others.endswith("_ob") and others[:-3] != own
    assert others[:-3].rsplit("-", 1)[1] == own.rsplit("-", 1)[1], "the same tenant's hash"
    assert Identities(switch_users=False).resolve("team-a", on_behalf=True) is None


@needs_root
def test_what_a_deleted_account_left_in_the_hosts_shared_places_goes_with_it(
        accounts: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`useradd` gives a freed uid to the next account: a file the deleted tenant's pod left in /tmp,
    a segment in /dev/shm or a System V one, would be readable by a tenant made later. They go with
    the account, at any depth and only its own; the others' stay."""
    name = account_name("leaving", "t5f1")
    accounts.append(name)
    made = ensure_account(name)
    shared = Path("/tmp") / f"gpupool-test-shared-{os.getpid()}"
    shared.mkdir(mode=0o1777)
    os.chmod(shared, 0o1777)  # as /tmp: every account writes, each its own
    try:
        script = ('mkdir -p "$1/mine/deeper" && echo x > "$1/mine/deeper/secret" '
                  '&& echo x > "$1/loose-secret" && echo x > "/dev/shm/$2"')
        shm_name = f"gpupool-test-{os.getpid()}"
        as_it: dict[str, Any] = {"user": made.uid, "group": made.gid, "env": {"PATH": "/usr/bin:/bin"},
                                 "cwd": "/"}
        subprocess.run(["/bin/sh", "-c", script, "-", str(shared), shm_name], check=True, **as_it)
        ipcmk = subprocess.run(["ipcmk", "-M", "4096"], check=True, capture_output=True, text=True, **as_it)
        segment = ipcmk.stdout.split()[-1]
        (shared / "someone-elses").write_text("kept")  # root's, beside them
        assert identity._ipc_owned(Path("/proc/sysvipc/shm"), {made.uid}) == [segment]
        swept: list[int] = []
        sweep = identity.remove_left_behind
        monkeypatch.setattr(identity, "remove_left_behind",
                            lambda uids: swept.append(sweep(uids)) or swept[-1])
        assert remove_account(name) is True
        # mine/ (with what is below it), loose-secret, the /dev/shm file, the segment: and only those
        assert swept == [4] and sorted(p.name for p in shared.iterdir()) == ["someone-elses"]
        assert not (Path("/dev/shm") / shm_name).exists()
        assert identity._ipc_owned(Path("/proc/sysvipc/shm"), {made.uid}) == []
    finally:
        identity.remove_tree(shared)
        with contextlib.suppress(OSError):
            (Path("/dev/shm") / f"gpupool-test-{os.getpid()}").unlink()
