"""`gpupool queue create|set|ls` as a process against a live server: cohorts, limits and weights,
set changing only what it is given, `none` clearing, and ls reporting used, borrowed, lent and the
reserved head in every output format."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import update

from cli.cliproc import gpupool, one_line_error
from factories import node
from gpupool.client import Client
from gpupool.config import PoolConfig
from gpupool.server.orm import WorkloadRow
from live import LiveServer, live_server
from server.fakes import ManualProvider
from server.upproc import until

ADMISSION_ONLY = PoolConfig.model_validate({"scheduling": {
    "placement": "first-fit", "ordering": "priority-fifo", "preemption": False, "backfill": False}})


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    provider = ManualProvider([node("n0", devices=8, model="H100")])
    with live_server(tmp_path_factory.mktemp("queues"), provider, config=ADMISSION_ONLY) as server:
        yield server


def run(srv: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    return gpupool(srv.url, srv.admin_token, "queue", *args)


def out(srv: LiveServer, *args: str) -> str:
    result = run(srv, *args)
    assert result.returncode == 0 and result.stderr == "", (result.returncode, result.stderr)
    return result.stdout


def row(table: str, key: str) -> list[str]:
    """The cells of the table row whose first cell is `key` (piped: one line per row, two spaces or
    more between cells, none empty)."""
    for line in table.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0] == key:
            return cells
    raise AssertionError(f"no row {key!r} in:\n{table}")


def test_create_set_and_clear(srv: LiveServer) -> None:
    with Client(srv.url, srv.admin_token) as pool:
        pool.create_tenant("team-s")
    assert out(srv, "create", "team-s", "train", "--quota", "4", "--cohort", "lab", "--lending-limit", "1.5",
               "--borrowing-limit", "2", "--weight", "3") == "team-s/train\n"
    assert out(srv, "set", "team-s", "train", "--quota", "6") == (
        "team-s/train quota 6, cohort lab, borrowing limit 2, lending limit 1.5, weight 3\n")
    assert out(srv, "set", "team-s", "train", "--borrowing-limit", "none", "--cohort", "NONE") == (
        "team-s/train quota 6, cohort none, borrowing limit none, lending limit 1.5, weight 3\n")
    listed = json.loads(out(srv, "ls", "-t", "team-s", "-o", "json"))
    train = next(q for q in listed if q["name"] == "train")
    assert (train["quota_gpus"], train["cohort"], train["borrowing_limit_gpus"], train["lending_limit_gpus"],
            train["weight"]) == (6, None, None, 1.5, 3)


@pytest.mark.parametrize(("args", "code", "says"), [
    (["set", "team-r", "q"], 2, "Error: Give at least one of --quota, --cohort"),
    (["set", "team-r", "q", "--quota", "-2"], 2, "Error: --quota must be >= 0 (got -2)."),
    (["set", "team-r", "q", "--quota", "lots"], 2, "Error: --quota must be a number of devices or 'none'"),
    (["set", "team-r", "q", "--weight", "0"], 2, "Error: --weight must be a number above 0 (got '0')."),
    (["set", "team-r", "q", "--lending-limit", "3"], 2, "Error: Queue team-r/q's lending limit (3) cannot "
                                                        "exceed its quota (2)"),
    (["set", "team-r", "q", "--quota", "none"], 2, "Error: Queue team-r/q has no quota, so a borrowing"),
    (["set", "team-r", "nope", "--quota", "1"], 3, "Error: No queue team-r/nope"),
    (["create", "team-r", "q", "--quota", "1"], 2, "Error: Queue team-r/q already exists"),
    (["create", "team-r", "x", "--cohort", "Bad Name"], 2, "Error: "),
])
def test_refusals_are_one_sentence(srv: LiveServer, args: list[str], code: int, says: str) -> None:
    with Client(srv.url, srv.admin_token) as pool:
        if not any(t.name == "team-r" for t in pool.tenants()):
            pool.create_tenant("team-r")
            pool.create_queue("team-r", "q", 2, borrowing_limit_gpus=1)
    one_line_error(run(srv, *args), code, says)


def test_ls_shows_use_borrowing_lending_and_the_reserved_head(srv: LiveServer) -> None:
    with Client(srv.url, srv.admin_token) as pool:
        pool.create_tenant("team-l")
        pool.create_queue("team-l", "a", 1, cohort="c")
        pool.create_queue("team-l", "b", 3, cohort="c", lending_limit_gpus=2, weight=2)
        ids = [pool.submit({"command": ["true"], "tenant": "team-l", "queue": "a", "resources": {"gpus": 1}})
               for _ in range(4)]
        until(lambda: sum(pool.workload(w).status == "running" for w in ids) == 3, 30, "a to borrow 2")
        until(lambda: any(pool.workload(w).reason for w in ids if pool.workload(w).status == "pending"), 30,
              "the fourth to be considered")
        waiting = next(w for w in ids if pool.workload(w).status == "pending")
    with srv.rt.store.write() as session:  # what the loop records under backfill
        session.execute(update(WorkloadRow).where(WorkloadRow.id == waiting)
                        .values(reserved_start_s=time.time() + 600))
    table = out(srv, "ls", "-t", "team-l")
    assert row(table, "TENANT/QUEUE") == ["TENANT/QUEUE", "COHORT", "NOMINAL", "USED", "BORROWED", "LENT",
                                          "WEIGHT", "PENDING", "RESERVED"]
    a = row(table, "team-l/a")
    assert a[1:8] == ["c", "1", "3", "2", "0", "1", "1"]
    assert a[8].startswith(waiting) and a[8].endswith(("in 10m", "in 9m"))
    assert row(table, "team-l/b")[1:9] == ["c", "3", "0", "0", "2", "2", "0", "-"]
    wide = out(srv, "ls", "-t", "team-l", "-o", "wide")
    assert "BORROW LIMIT" in wide and "RUNNING" in wide
    assert row(wide, "team-l/b")[6:8] == ["-", "2"]  # borrowing limit, lending limit
    objects = {q["name"]: q for q in json.loads(out(srv, "ls", "-t", "team-l", "-o", "json"))}
    assert (objects["a"]["used_gpus"], objects["a"]["borrowed_gpus"], objects["b"]["lent_gpus"]) == (3, 2, 2)
    assert objects["a"]["reserved_workload"] == waiting and objects["b"]["reserved_workload"] is None
    names = out(srv, "ls", "-t", "team-l", "-o", "name").splitlines()
    assert names == ["team-l/a", "team-l/b", "team-l/default"]
