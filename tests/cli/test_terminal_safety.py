"""What a tenant sends must not reach the admin's terminal as an escape sequence or as rich markup:
audit details quote refused requests, service events quote a scaler's reason. And the admin token
the server wrote on this machine goes to servers on this machine only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pydantic
import pytest
from typer.testing import CliRunner

from factories import node
from gpupool import clientconfig
from gpupool.api.services import ScaleRequest
from gpupool.cli.main import app
from gpupool.cli.output import visible
from live import LiveServer, cli_env, live_server
from server.fakes import ManualProvider

OSC52 = "\x1b]52;c;ZWNobyBwd25lZAo=\x07"
"""Writes the reader's clipboard in most terminals."""


@pytest.fixture
def srv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    with live_server(tmp_path, ManualProvider([node("n0", devices=4, model="H100")]),
                     before_serving=cli_env(monkeypatch, COLUMNS="200")) as server:
        yield server


def test_the_audit_table_shows_a_tenants_markup_as_text(srv: LiveServer) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["tenant", "create", "team-a"]).exit_code == 0
    token = runner.invoke(app, ["token", "create", "--tenant", "team-a"]).stdout.strip()
    for sent in ("[/]", "[link=https://evil.example/]x[/link]"):  # refused: audited with what was sent
        answer = httpx.get(f"{srv.url}/api/v1/usage", params={"tenant": sent},
                           headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 403
    srv.rt.auth.flush()
    shown = runner.invoke(app, ["audit", "--limit", "10"])
    assert shown.exit_code == 0, shown.stdout + shown.stderr  # "[/]" as markup: a MarkupError
    assert "[/]" in shown.stdout and "https://evil.example/" in shown.stdout  # as the text it was
    assert "\x1b]8;" not in shown.stdout  # never a terminal link


def test_a_scale_reason_holds_no_control_character() -> None:
    with pytest.raises(pydantic.ValidationError, match="control character U\\+001B"):
        ScaleRequest(replicas=1, reason=OSC52)
    assert ScaleRequest(replicas=1, reason="load went up").reason == "load went up"


def test_what_the_server_quotes_is_printed_with_its_escapes_visible() -> None:
    assert visible(f"scaled: {OSC52}") == "scaled: \\x1b]52;c;ZWNobyBwd25lZAo=\\x07"
    assert visible("plain text, tabs\tand all") == "plain text, tabs\\x09and all"


@pytest.mark.parametrize(("url", "gets_it"), [
    ("http://127.0.0.1:8765", True),
    ("http://localhost:8765", True),
    ("http://[::1]:8765", True),
    ("http://127.0.0.1:8765,http://localhost:8766", True),
    ("http://localhost.evil.example:8765", False),
    ("http://127.0.0.1.nip.io:8765", False),
    ("http://127.0.0.1:8765,https://pool.other.example", False),
])
def test_the_local_admin_token_goes_to_this_machine_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        url: str, gets_it: bool) -> None:
    import platformdirs

    monkeypatch.setattr(platformdirs, "user_data_dir", lambda *a, **k: str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("GPUPOOL_TOKEN", raising=False)
    monkeypatch.delenv("GPUPOOL_URL", raising=False)
    (tmp_path / "admin-token").write_text("gp_admin\n")
    assert (clientconfig.resolve(url)[1] == "gp_admin") is gets_it


def test_node_join_refuses_a_ray_token_others_can_read(tmp_path: Path) -> None:
    """Pods of tenants run as other accounts on the GPU server that joins: a Ray token they can read
    lets them reach the cluster's store and run code on every node (the server refuses such a file)."""
    from gpupool.cli.node_join import _check_token
    from gpupool.errors import InvalidInput

    token = tmp_path / "ray-token"
    token.write_text("t" * 64)
    token.chmod(0o644)
    with pytest.raises(InvalidInput, match="chmod 600"):
        _check_token(token)
    token.chmod(0o600)
    assert _check_token(token) == token
