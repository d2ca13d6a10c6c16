"""The typed SDK against a live server: round trips, typed errors, configuration sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from factories import node
from gpupool.client import Client
from gpupool.clientconfig import resolve
from gpupool.errors import Forbidden, InvalidInput, NotFound, QuotaExceeded, Unauthorized, Unavailable
from live import live_server
from server.fakes import ManualProvider


def test_sdk_round_trip_and_typed_errors(tmp_path: Path) -> None:
    provider = ManualProvider([node("n0", devices=2, model="H100")], exit_code=0)
    with live_server(tmp_path, provider) as srv, Client(srv.url, srv.admin_token) as admin:
        assert admin.health().status == "ok"
        wid = admin.submit({"command": ["true"], "resources": {"gpus": 0.5}})
        done = admin.wait(wid, timeout_s=20, poll_s=0.02)
        assert done.status == "succeeded" and done.exit_code == 0
        assert [e.to_status for e in admin.events(wid)][-1] == "succeeded"
        assert admin.workloads(status=["succeeded"]).total == 1
        admin.create_tenant("team-a")
        admin.create_queue("team-a", "tiny", quota_gpus=0.5)
        token = admin.create_token("team-a").token
        with pytest.raises(QuotaExceeded):
            admin.submit({"command": ["true"], "tenant": "team-a", "queue": "tiny", "resources": {"gpus": 1}})
        with pytest.raises(InvalidInput, match="gpus"):
            admin.submit({"command": ["true"], "resources": {"gpus": 1.5}})
        with Client(srv.url, token) as tenant:
            with pytest.raises(NotFound):
                tenant.workload(wid)
            with pytest.raises(Forbidden):
                tenant.create_tenant("team-b")
        with Client(srv.url, "gp_wrong") as stranger, pytest.raises(Unauthorized):
            stranger.workloads()
        assert [n.name for n in admin.nodes()] == ["n0"]
        assert admin.pool().capacity_gpus == 2.0
    with Client(srv.url, "x") as gone, pytest.raises(Unavailable):
        gone.health()


def test_configuration_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "gpupool" / "config.toml"
    config.parent.mkdir()
    config.write_text('url = "http://10.0.0.1:9000/"\ntoken = "from-file"\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("GPUPOOL_URL", raising=False)
    monkeypatch.delenv("GPUPOOL_TOKEN", raising=False)
    assert resolve() == ("http://10.0.0.1:9000", "from-file")
    monkeypatch.setenv("GPUPOOL_TOKEN", "from-env")
    assert resolve() == ("http://10.0.0.1:9000", "from-env")
    assert resolve("http://h:1", "given") == ("http://h:1", "given")
    config.write_text("url = [broken")
    with pytest.raises(InvalidInput, match=r"config\.toml"):
        resolve()
