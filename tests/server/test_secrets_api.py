"""Secrets and mounts at the API, without root: the sealed store, the routes and their refusals,
the submit checks, and the values handed to the provider only at the launch (never stored).

The pods' side (mount namespaces, /run/secrets, a hostile tenant's pod) is in
tests/agent/test_pod_mounts.py and tests/server/test_secrets_live.py, which need root.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select, update

from cli_inproc import run_cli
from factories import node
from gpupool.client import Client
from gpupool.config import parse_config
from gpupool.errors import Conflict, Forbidden, GpupoolError, InvalidInput, NotFound
from gpupool.server.orm import SecretRow, WorkloadRow
from gpupool.server.secretbox import SecretBox
from live import LiveServer, live_server
from server.fakes import ManualProvider

VALUE = "pw-5c1e77a0-only-here"
CONFIG = parse_config("tenants:\n  team-a:\n    mounts:\n      - {path: /data/team-a, mode: ro}\n"
                      "      - {path: /data/team-a/scratch, mode: rw}\n")


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, ManualProvider]]:
    provider = ManualProvider([node("n0", devices=2, model="H100")])
    with live_server(tmp_path_factory.mktemp("secrets"), provider, config=CONFIG) as server:
        with Client(server.url, server.admin_token) as admin:
            for tenant in ("team-a", "team-b", "team-c"):
                admin.create_tenant(tenant)
        yield server, provider


@pytest.fixture(scope="module")
def srv(pool: tuple[LiveServer, ManualProvider]) -> LiveServer:
    return pool[0]


def tenant_client(srv: LiveServer, tenant: str) -> Client:
    with Client(srv.url, srv.admin_token) as admin:
        return Client(srv.url, admin.create_token(tenant).token)


def test_a_secret_is_stored_sealed_and_answered_without_its_value(srv: LiveServer) -> None:
    with tenant_client(srv, "team-a") as api:
        out = api.create_secret("db", {"password": VALUE, "user": "app"})
        assert (out.tenant, out.name, out.keys) == ("team-a", "db", ["password", "user"])
        assert VALUE not in str(api.request("GET", "/secrets"))
        with pytest.raises(Conflict, match=r"already has a secret named 'db'.*--replace"):
            api.create_secret("db", {"password": "x"})
        replaced = api.create_secret("db", {"password": VALUE, "user": "app"}, replace=True)
        assert replaced.created_s == out.created_s and replaced.updated_s >= out.updated_s
    key = srv.rt.settings.data_dir / "secrets.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    with srv.rt.store.read() as session:
        row = session.scalars(select(SecretRow).where(SecretRow.tenant == "team-a",
                                                      SecretRow.name == "db")).one()
        assert VALUE.encode() not in row.sealed and row.revision == 1
    for path in srv.rt.settings.data_dir.glob("gpupool.sqlite*"):
        assert VALUE.encode() not in path.read_bytes()


def test_a_sealed_value_opens_only_as_its_own_tenant_and_name(tmp_path: Path) -> None:
    """A row copied to another tenant (by someone who can write the store) does not open there."""
    box = SecretBox(tmp_path)
    sealed = box.seal("team-a", "db", {"password": b"v"})
    assert box.open("team-a", "db", sealed) == {"password": b"v"}
    for tenant, name in (("team-b", "db"), ("team-a", "other")):
        with pytest.raises(GpupoolError, match="does not open with this pool's key"):
            box.open(tenant, name, sealed)
    (tmp_path / "secrets.key").chmod(0o644)
    with pytest.raises(InvalidInput, match="mode 0600"):
        SecretBox(tmp_path).open("team-a", "db", sealed)


def test_another_tenants_secret_is_as_if_it_did_not_exist(srv: LiveServer) -> None:
    with tenant_client(srv, "team-a") as owner:
        owner.create_secret("shared-name", {"K": "v"})
    with tenant_client(srv, "team-b") as thief:
        assert thief.secrets() == [] and thief.secrets("team-b") == []
        with pytest.raises(Forbidden, match="belongs to tenant 'team-b'; it cannot act for 'team-a'"):
            thief.secrets("team-a")  # refused, as `ls` and `usage` refuse it: not a list of its own
        said = {}
        for name in ("shared-name", "never-made"):
            with pytest.raises(Forbidden, match="it cannot act for 'team-a'"):
                thief.delete_secret(name, tenant="team-a")  # whether it exists or not
            with pytest.raises(NotFound) as deleted:
                thief.delete_secret(name)
            with pytest.raises(NotFound) as used:
                thief.submit(command=["true"], secrets=[f"{name}:K"])
            said[name] = (deleted.value.message.replace(name, "N"), used.value.message.replace(name, "N"))
        assert said["shared-name"] == said["never-made"]
        assert "Tenant 'team-b' has no secret named 'N'" in said["never-made"][1]
    with Client(srv.url, srv.admin_token) as admin:
        assert "shared-name" in [s.name for s in admin.secrets("team-a")]  # untouched


@pytest.mark.parametrize(("use", "said"), [
    ("db:ONE", "holds 2 keys, so it cannot be one variable ONE"),
    ("db:/etc/db", "must lie under /run/secrets/"),
    ("db:lower-case", "is not a variable's name"),
])
def test_a_secret_that_cannot_be_given_as_asked_is_refused_at_submit(srv: LiveServer, use: str,
                                                                     said: str) -> None:
    with tenant_client(srv, "team-c") as api:
        if not api.secrets():
            api.create_secret("db", {"password": VALUE, "user": "app"})
        with pytest.raises(InvalidInput, match=said):
            api.submit(command=["true"], secrets=[use])


@pytest.mark.parametrize(("tenant", "mount", "said"), [
    ("team-a", "/etc:/mnt:ro", "/etc is outside the roots tenant 'team-a' may mount from: /data/team-a (ro), "
                               "/data/team-a/scratch (rw)"),
    ("team-a", "/data/team-a/set:/mnt", "lies in a read-only root of tenant 'team-a'; mount it with :ro"),
    ("team-a", "/data/team-ab:/mnt:ro", "outside the roots"),
    ("team-b", "/data/team-a:/mnt:ro", "Tenant 'team-b' may not mount anything"),
])
def test_a_mount_outside_the_tenants_roots_is_refused_naming_them(srv: LiveServer, tenant: str, mount: str,
                                                                  said: str) -> None:
    with tenant_client(srv, tenant) as api, pytest.raises(InvalidInput, match=re.escape(said)):
        api.submit(command=["true"], mounts=[mount])


def test_the_values_reach_the_provider_at_the_launch_and_are_never_stored(
        pool: tuple[LiveServer, ManualProvider]) -> None:
    srv, provider = pool
    with tenant_client(srv, "team-a") as api:
        api.create_secret("tok", {"TOKEN": VALUE})
        workload_id = api.submit(command=["true"], secrets=["tok", "tok:/run/secrets/t"],
                                 mounts=["/data/team-a/scratch/run1:/mnt", "/data/team-a/set:/data:ro"])
        deadline = time.monotonic() + 30
        while not any(p.workload_id == workload_id for p in provider.launched.values()):
            assert time.monotonic() < deadline, "never launched"
            srv.rt.wake.set()
            time.sleep(0.02)
    launch = next(p for p in provider.launched.values() if p.workload_id == workload_id)
    assert [(s.name, s.env, s.path, dict(s.data or {})) for s in launch.secrets] == [
        ("tok", "", "", {"TOKEN": VALUE.encode()}), ("tok", "", "/run/secrets/t", {"TOKEN": VALUE.encode()})]
    assert [(m.source, m.target, m.read_only, m.root) for m in launch.mounts] == [
        ("/data/team-a/scratch/run1", "/mnt", False, "/data/team-a/scratch"),
        ("/data/team-a/set", "/data", True, "/data/team-a")]
    assert VALUE not in repr(launch) and VALUE not in str(launch.env)
    with srv.rt.store.read() as session:
        row = session.get(WorkloadRow, workload_id)
        assert row is not None and VALUE not in str(row.spec)
        assert row.spec["secrets"] == [{"name": "tok"}, {"name": "tok", "path": "/run/secrets/t"}]


def test_a_mount_no_longer_allowed_reaches_the_node_without_a_root(
        pool: tuple[LiveServer, ManualProvider]) -> None:
    """The configuration may change between submit and launch: the node then refuses the mount."""
    srv, provider = pool
    with tenant_client(srv, "team-a") as api:
        # It waits on a blocker until its stored spec is changed: without the wait it could be launched
        # before the change on a loaded machine (it was, once, in a full run).
        blocker = api.submit(command=["sleep", "3600"])
        workload_id = api.submit(command=["true"], mounts=["/data/team-a/set:/data:ro"],
                                 dependency=f"afterany:{blocker}")
        with srv.rt.store.write() as session:  # as if it had been stored before the root was removed
            session.execute(update(WorkloadRow).where(WorkloadRow.id == workload_id).values(
                spec={**session.get(WorkloadRow, workload_id).spec,
                      "mounts": [{"source": "/elsewhere", "target": "/data", "read_only": True}]}))
        assert not any(p.workload_id == workload_id for p in provider.launched.values())
        api.cancel(blocker)
    deadline = time.monotonic() + 30
    while not any(p.workload_id == workload_id for p in provider.launched.values()):
        assert time.monotonic() < deadline, "never launched"
        srv.rt.wake.set()
        time.sleep(0.02)
    launch = next(p for p in provider.launched.values() if p.workload_id == workload_id)
    assert [(m.source, m.root) for m in launch.mounts] == [("/elsewhere", "")]


def test_deleting_a_tenant_deletes_its_secrets(srv: LiveServer) -> None:
    with Client(srv.url, srv.admin_token) as admin:
        admin.create_tenant("short-lived")
        with tenant_client(srv, "short-lived") as theirs:
            theirs.create_secret("k", {"A": "b"})
        admin.delete_tenant("short-lived")
        admin.create_tenant("short-lived")
        assert admin.secrets("short-lived") == []


def test_the_configuration_checks_mount_roots() -> None:
    with pytest.raises(InvalidInput, match="a mount root of / would let the tenant mount every file"):
        parse_config("tenants:\n  team-a:\n    mounts:\n      - {path: /}\n")
    with pytest.raises(InvalidInput, match=re.escape("must be written without '.', '..'")):
        parse_config("tenants:\n  team-a:\n    mounts:\n      - {path: /data/../etc}\n")
    with pytest.raises(InvalidInput, match="mode"):
        parse_config("tenants:\n  team-a:\n    mounts:\n      - {path: /data, mode: write}\n")
    assert CONFIG.mount_roots("team-a")[0].mode == "ro" and CONFIG.mount_roots("nobody") == []


def test_config_check_names_a_bad_mount_root_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text("tenants:\n  team-a:\n    mounts:\n      - {path: data/team-a}\n"
                    "      - {path: /d, mode: rwx}\n")
    checked = run_cli(["config", "check", str(path)], os.environ)
    assert checked.returncode == 2 and checked.stdout == "", checked.stderr
    lines = checked.stderr.splitlines()
    assert f"{path} line 4" in lines[0] and "must be an absolute path" in lines[0], lines
    assert f"{path} line 5" in lines[1] and "mode" in lines[1], lines
    path.write_text("tenants:\n  team-a:\n    mounts:\n      - {path: /data/team-a, mode: rw}\n")
    checked = run_cli(["config", "check", str(path)], os.environ)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("tenant", ["team-a", "default", None])
def test_only_the_tenants_own_tokens_write_its_secrets(srv: LiveServer, tenant: str | None) -> None:
    """A secret's keys become variables of the tenant's own pods: the admin replacing one with an
    LD_PRELOAD key ran a library of its own as the tenant's account, which read the tenant's other
    pods. The admin lists and deletes them, and writes none, for any tenant."""
    with tenant_client(srv, "team-a") as theirs:
        theirs.create_secret("cfg", {"TOKEN": "t"})
    with Client(srv.url, srv.admin_token) as admin:
        for replace in (False, True):
            with pytest.raises(Forbidden, match="created and replaced with one of its own tokens only"):
                admin.create_secret("cfg", {"LD_PRELOAD": "/tmp/x.so"}, tenant=tenant, replace=replace)
        assert [s.keys for s in admin.secrets("team-a") if s.name == "cfg"] == [["TOKEN"]]
        admin.delete_secret("cfg", tenant="team-a")
        assert "cfg" not in [s.name for s in admin.secrets("team-a")]
