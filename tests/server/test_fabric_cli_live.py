"""`gpupool fabric status | fail-link LINK | heal-link LINK` and `gpupool show` on a pool started with
a fabric, answered through the real API in-process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import typer
from fabric_pool import Pool
from typer.testing import CliRunner

from gpupool.cli import fabric_live, show
from gpupool.cli.main import app
from gpupool.client import Client

runner = CliRunner()


@pytest.fixture
def pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pool]:
    made = Pool(tmp_path)

    def connect() -> Client:
        return Client("http://testserver", made.admin, transport=made.client._transport)

    monkeypatch.setattr(fabric_live, "client", connect)
    monkeypatch.setattr(show, "client", connect)
    yield made
    made.close()


def gp(*args: str, code: int = 0) -> str:
    result = runner.invoke(cast(typer.Typer, app), list(args), env={"COLUMNS": "250"})
    assert result.exit_code == code, result.output
    return result.output


def test_status_fail_and_heal_a_link_of_the_running_pool(pool: Pool) -> None:
    gang = pool.gang()
    found = json.loads(gp("fabric", "status", "--workload", gang, "--json"))
    path, kinds = found["gang"], {link["id"]: link["kind"] for link in found["links"]}
    assert "every link is up" in gp("fabric", "status")
    uplink = next(lid for lid in path["links"] if kinds[lid] == "switch")  # its leaf has another
    failed = gp("fabric", "fail-link", uplink)
    assert failed.startswith(f"Failed {uplink}: 0 gangs cut off and requeued")
    status = gp("fabric", "status", "--workload", gang)
    assert "FAILED" in status and f"(id {uplink})" in status
    assert f"{gang}: {', '.join(path['nodes'])}: spine, 4 hops, bottleneck " in status
    assert "already failed" in gp("fabric", "fail-link", uplink)
    assert gp("fabric", "heal-link", uplink).startswith(f"Healed {uplink}")
    assert "every link is up" in gp("fabric", "status")


def test_show_gives_the_placements_network(pool: Pool) -> None:
    gang = pool.gang()
    network = json.loads(gp("show", gang, "--json"))["network"]
    assert network["domain"] == "spine" and network["hops"] == 4 and network["bottleneck_gbps"] > 0
    assert "network: spine, 4 hops, bottleneck " in gp("show", gang)


def test_a_bad_link_is_one_sentence_and_a_tenant_may_not(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    out = gp("fabric", "fail-link", "nosuch:1", code=3)
    assert "No switch or adapter 'nosuch'" in out and "Traceback" not in out
    monkeypatch.setattr(fabric_live, "client", lambda: Client("http://testserver", pool.tenant,
                                                              transport=pool.client._transport))
    link = json.loads(gp("fabric", "status", "--json"))["links"][0]["id"]
    assert "admin" in gp("fabric", "heal-link", link, code=3).lower()
