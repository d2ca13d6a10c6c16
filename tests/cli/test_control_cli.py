"""The control-plane CLI end to end against a live server on a free loopback port."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from factories import node
from gpupool.cli.main import app
from live import LiveServer, cli_env, live_server
from server.fakes import ManualProvider

runner = CliRunner()


@pytest.fixture
def srv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    provider = ManualProvider([node("n0", devices=4, model="H100")], exit_code=0)
    with live_server(tmp_path, provider, before_serving=cli_env(monkeypatch)) as server:
        yield server


def gp(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def test_submit_wait_show_ls_cancel(srv: LiveServer) -> None:
    code, out = gp("submit", "--gpus", "0.25", "--name", "t1", "--env", "A=1", "--", "echo", "hi")
    assert code == 0
    wid = out.strip()
    assert wid.startswith("w-") and "\n" not in wid  # only the id
    assert gp("wait", wid, "--timeout", "20")[0] == 0
    code, out = gp("show", wid, "--json")
    shown = json.loads(out)
    assert code == 0 and shown["status"] == "succeeded" and shown["spec"]["env"] == {"A": "1"}
    code, out = gp("show", wid)
    assert code == 0 and "succeeded" in out and "completed" in out
    code, out = gp("ls")
    assert code == 0 and wid[:8] in out
    assert gp("logs", wid)[0] == 0
    assert gp("cancel", wid)[0] == 2  # already finished
    assert gp("show", "w-missing")[0] == 3
    assert gp("ls", "--status", "sleepy")[0] == 2


def test_admin_verbs_and_tenant_token(srv: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = gp("tenant", "create", "team-a")
    assert code == 0 and out.splitlines()[0] == "team-a"  # then a warning when the server is not root
    assert gp("tenant", "create", "Team A")[0] == 2
    assert gp("queue", "create", "team-a", "batch", "--quota", "1")[0] == 0
    code, out = gp("queue", "ls")
    assert code == 0 and "team-a/batch" in out
    code, token = gp("token", "create", "--tenant", "team-a")
    assert code == 0 and token.startswith("gp_")
    code, out = gp("tenant", "ls")
    assert code == 0 and "team-a" in out
    code, out = gp("nodes")
    assert code == 0 and "n0" in out
    assert gp("top", "--once")[0] == 0
    monkeypatch.setenv("GPUPOOL_TOKEN", token.strip())
    assert gp("tenant", "create", "team-b")[0] == 3  # forbidden
    code, _ = gp("submit", "--queue", "batch", "--gpus", "2", "--", "true")
    assert code == 2  # over the queue quota
    monkeypatch.setenv("GPUPOOL_TOKEN", "gp_wrong")
    assert gp("ls")[0] == 3


def test_submit_fast_path_as_a_process(srv: LiveServer, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("command: [echo, from-file]\nresources: {gpus: 0.5}\nname: filed\n")

    def run(*args: str, url: str = srv.url) -> subprocess.CompletedProcess[str]:
        env = {"GPUPOOL_URL": url, "GPUPOOL_TOKEN": srv.admin_token, "PATH": "/usr/bin:/bin"}
        return subprocess.run(
            [sys.executable, "-m", "gpupool.cli.main", "submit", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )

    ok = run("-f", str(spec), "--gpus", "0.25")
    assert ok.returncode == 0 and ok.stdout.strip().startswith("w-") and ok.stderr == ""
    assert run("--gpus", "lots", "--", "true").returncode == 2
    assert (
        run(
            "--",
        ).returncode
        == 2
    )
    assert run("--queue", "nope", "--", "true").returncode == 3
    unreachable = run("--", "true", url="http://127.0.0.1:9")
    assert unreachable.returncode == 4 and "Cannot reach" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr
