"""The security verbs end to end against a live server: tenant limits, token lifecycle, audit."""

from __future__ import annotations

import pwd
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from factories import node
from gpupool.cli.main import app
from gpupool.client import Client
from gpupool.server.services import tenants as tenants_service
from live import LiveServer, cli_env, live_server
from server.fakes import ManualProvider

runner = CliRunner()


@pytest.fixture
def srv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    provider = ManualProvider([node("n0", devices=4, model="H100")])
    with live_server(tmp_path, provider, before_serving=cli_env(monkeypatch, COLUMNS="200")) as server:
        yield server


def gp(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def _account() -> str:
    for entry in pwd.getpwall():
        if entry.pw_uid != 0 and len(entry.pw_name) <= 32:
            return entry.pw_name
    pytest.skip("this machine has no unprivileged Unix account")


def test_tenant_create_set_and_ls_show_limits_and_account(srv: LiveServer) -> None:
    user = _account()
    code, out, _ = gp("tenant", "create", "team-a", "--unix-user", user, "--max-priority", "5",
                      "--max-pending", "40")
    assert (code, out) == (0, "team-a\n")
    code, out, _ = gp("tenant", "ls")
    assert code == 0 and user in out and "40" in out and "MAX PRIORITY" in out
    code, out, _ = gp("tenant", "set", "team-a", "--no-unix-user", "--max-priority", "-10")
    assert code == 0 and out == "team-a max-priority -10 max-pending 40 unix-user - budget -\n"
    code, _, err = gp("tenant", "create", "team-b", "--unix-user", "no-such-account-x")
    assert code == 2 and "There is no Unix account 'no-such-account-x'" in err and "Traceback" not in err
    assert gp("tenant", "create", "team-b", "--unix-user", "root")[0] == 2
    assert gp("tenant", "set", "team-a")[0] == 2  # nothing to change
    assert gp("tenant", "set", "nobody-here", "--max-pending", "1")[0] == 3


def test_a_second_tenant_on_a_non_root_server_warns_on_stderr(
        srv: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tenants_service, "server_is_root", lambda: False)
    code, out, err = gp("tenant", "create", "team-a")
    assert (code, out) == (0, "team-a\n")
    assert err.startswith("Warning: ") and "not isolated from each other" in err


def test_priority_above_the_limit_and_too_many_pending_exit_2(
        srv: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    assert gp("nodes", "cordon", "n0")[0] == 0
    assert gp("tenant", "create", "team-a", "--max-pending", "1")[0] == 0
    code, token, _ = gp("token", "create", "--tenant", "team-a")
    monkeypatch.setenv("GPUPOOL_TOKEN", token.strip())
    code, _, err = gp("submit", "--priority", "3", "--", "true")
    assert code == 2 and "may submit at priority <= 0" in err and "--max-priority N" in err
    assert gp("submit", "--", "true")[0] == 0
    code, _, err = gp("submit", "--", "true")
    assert code == 2 and "already has 1 pending workloads" in err
    # The fast path (`gpupool submit` as a process) exits the same way.
    env = {"GPUPOOL_URL": srv.url, "GPUPOOL_TOKEN": token.strip(), "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, "-m", "gpupool.cli.main", "submit", "--priority", "9", "--", "true"]
    fast = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert fast.returncode == 2 and "priority <= 0" in fast.stderr


def test_token_create_ls_revoke(srv: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    assert gp("tenant", "create", "team-a")[0] == 0
    code, secret, _ = gp("token", "create", "--tenant", "team-a", "--name", "ci", "--expires", "12h")
    assert code == 0 and secret.startswith("gp_")
    assert gp("token", "create", "--tenant", "team-a", "--name", "ci")[0] == 2  # duplicate name
    assert gp("token", "create", "--tenant", "team-a", "--expires", "soon")[0] == 2
    metrics = ("--admin", "--name", "prom", "--scope", "metrics", "--expires", "never")
    assert gp("token", "create", *metrics)[0] == 0
    code, out, _ = gp("token", "ls")
    assert code == 0 and "ci" in out and "prom" in out and "metrics" in out and "never" in out
    assert secret.strip() not in out
    monkeypatch.setenv("GPUPOOL_TOKEN", secret.strip())
    code, out, _ = gp("token", "ls")
    assert code == 0 and "ci" in out and "prom" not in out  # a tenant sees only its own
    monkeypatch.setenv("GPUPOOL_TOKEN", srv.admin_token)
    assert gp("token", "revoke", "ci")[0] == 2  # a name needs --tenant
    code, out, _ = gp("token", "revoke", "ci", "--tenant", "team-a")
    assert code == 0 and out.startswith("revoked tok-") and "(ci)" in out
    monkeypatch.setenv("GPUPOOL_TOKEN", secret.strip())
    code, _, err = gp("ls")
    assert code == 3 and "revoked" in err
    monkeypatch.setenv("GPUPOOL_TOKEN", srv.admin_token)
    code, out, _ = gp("token", "create", "--tenant", "team-a", "--name", "ci")  # the name is free again
    assert code == 0
    with Client(srv.url, srv.admin_token) as pool:
        token_id = next(t.id for t in pool.tokens("team-a") if t.revoked_s is None)
    code, out, _ = gp("token", "revoke", token_id)
    assert code == 0 and out.startswith(f"revoked {token_id}")
    assert gp("token", "revoke", "tok-missing")[0] == 3


def test_audit_shows_admin_actions_and_refusals(srv: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    assert gp("tenant", "create", "team-a")[0] == 0
    assert gp("nodes", "cordon", "n0")[0] == 0
    monkeypatch.setenv("GPUPOOL_TOKEN", "gp_wrong")
    assert gp("ls")[0] == 3
    monkeypatch.setenv("GPUPOOL_TOKEN", srv.admin_token)
    code, out, _ = gp("audit", "--since", "1h")
    assert code == 0 and "tenant.create" in out and "node.cordon" in out and "auth.refused" in out
    code, out, _ = gp("audit", "--limit", "1")
    assert code == 0 and "1 audit record(s)" in out
    assert gp("audit", "--since", "yesterday-ish")[0] == 2
    assert gp("audit", "--since", "2020-01-01")[0] == 0
    _, token, _ = gp("token", "create", "--tenant", "team-a")
    monkeypatch.setenv("GPUPOOL_TOKEN", token.strip())
    assert gp("audit")[0] == 3  # admin only


def test_tenant_delete_refuses_with_a_sentence_while_work_is_unfinished(srv: LiveServer) -> None:
    assert gp("tenant", "create", "team-d")[0] == 0
    with Client(srv.url, srv.admin_token) as pool:
        workload = pool.submit(command=["train"], gpus=1, tenant="team-d")
    code, _, err = gp("tenant", "delete", "team-d")
    assert code != 0 and "Traceback" not in err
    assert "Tenant 'team-d' still has 1 unfinished workload(s)" in err
    assert gp("cancel", workload)[0] == 0
    with Client(srv.url, srv.admin_token) as pool:  # its pod, if it had started, ends at the next sync
        deadline = time.monotonic() + 30
        while any(p.status in ("launching", "running", "stopping") for p in pool.workload(workload).pods):
            assert time.monotonic() < deadline, "the cancelled workload's pod did not end"
            time.sleep(0.05)
    code, out, err = gp("tenant", "delete", "team-d")
    assert code == 0, err
    assert out.startswith("team-d deleted (1 finished workload(s) removed")
    assert "team-d" not in gp("tenant", "ls")[1]
    assert gp("tenant", "delete", "team-d")[0] == 3  # not found
