"""Issue 13 item 3: `-o table|wide|json|name` on every listing verb, whole ids when piped, comma-list
and any-case filters, `ls --since`, and an unknown tenant or queue as exit 3 (not an empty table)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from cli.cliproc import gpupool, one_line_error
from factories import node
from gpupool.client import Client
from live import LiveServer, live_server
from server.fakes import ManualProvider
from server.upproc import until

LONG_NAME = "a-name-long-enough-to-be-wrapped-by-an-80-column-table-" + "x" * 8


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, dict[str, set[str]]]]:
    provider = ManualProvider([node("n0", devices=4, model="H100"), node("n1", devices=4, model="H100")])
    with live_server(tmp_path_factory.mktemp("output"), provider) as server, \
            Client(server.url, server.admin_token) as pool:
        pool.create_tenant("team-a")
        pool.create_queue("team-a", "held", quota_gpus=1)
        done = {pool.submit({"command": ["true"], "name": LONG_NAME, "resources": {"gpus": 0.5}})
                for _ in range(3)}
        held = {pool.submit({"command": ["true"], "tenant": "team-a", "queue": "held",
                             "resources": {"gpus": 1}}) for _ in range(2)}
        until(lambda: all(pool.workload(w).status == "running" for w in done), 30, "the work to run")
        for w in done:
            provider.finish(pool.workload(w).pods[0].id, 0)
        until(lambda: all(pool.workload(w).status == "succeeded" for w in done), 30, "the work to succeed")
        for w in held:
            pool.cancel(w)
        yield server, {"succeeded": done, "cancelled": held}


def run(srv: tuple[LiveServer, dict[str, set[str]]], *args: str) -> subprocess.CompletedProcess[str]:
    server, _ = srv
    return gpupool(server.url, server.admin_token, *args)


def lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0 and result.stderr == "", (result.returncode, result.stderr)
    return result.stdout.splitlines()


def test_ls_name_and_json(srv: tuple[LiveServer, dict[str, set[str]]]) -> None:
    _, ids = srv
    every = ids["succeeded"] | ids["cancelled"]
    names = lines(run(srv, "ls", "-o", "name"))
    assert sorted(names) == sorted(every)  # ids only, one per line, every one of them
    objects = json.loads(run(srv, "ls", "-o", "json").stdout)
    assert {o["id"] for o in objects} == every and {"request", "pods", "status"} <= set(objects[0])
    assert "spec" not in objects[0], "a list page leaves out commands and environments"
    whole = json.loads(run(srv, "ls", "-o", "json", "--full").stdout)
    assert {o["id"] for o in whole} == every and {"spec", "request", "pods"} <= set(whole[0])
    assert len(lines(run(srv, "ls", "-o", "NAME", "--limit", "2"))) == 2


def test_tables_keep_whole_ids_and_names_when_piped(srv: tuple[LiveServer, dict[str, set[str]]]) -> None:
    _, ids = srv
    table = run(srv, "ls")  # stdout is a pipe, COLUMNS=80
    assert table.returncode == 0
    for wid in ids["succeeded"] | ids["cancelled"]:
        assert wid in table.stdout
    assert table.stdout.count(LONG_NAME) == 3
    wide = run(srv, "ls", "-o", "wide")
    assert "PRIORITY" in wide.stdout and "ATTEMPT" in wide.stdout and "PRIORITY" not in table.stdout


def test_filters_take_comma_lists_any_case_and_since(srv: tuple[LiveServer, dict[str, set[str]]]) -> None:
    _, ids = srv
    every = ids["succeeded"] | ids["cancelled"]
    assert set(lines(run(srv, "ls", "-s", "SUCCEEDED,cancelled", "-o", "name"))) == every
    assert set(lines(run(srv, "ls", "-s", "Cancelled", "-s", "failed", "-o", "name"))) == ids["cancelled"]
    assert set(lines(run(srv, "ls", "-t", "TEAM-A", "-q", "held", "-o", "name"))) == ids["cancelled"]
    assert set(lines(run(srv, "ls", "-t", "default,team-a", "-o", "name"))) == every
    assert set(lines(run(srv, "ls", "--since", "1h", "-o", "name"))) == every
    assert lines(run(srv, "ls", "--since", "2999-01-01", "-o", "name")) == []


def test_unknown_filters_are_one_line_errors(srv: tuple[LiveServer, dict[str, set[str]]]) -> None:
    one_line_error(run(srv, "ls", "-t", "nosuch"), 3, "Error: No tenant 'nosuch'")
    one_line_error(run(srv, "ls", "-q", "nosuch"), 3, "Error: No queue 'nosuch'")
    one_line_error(run(srv, "ls", "-t", "default", "-q", "held"), 3,
                   "Error: No queue 'held' in tenant default")
    one_line_error(run(srv, "ls", "-s", "sleepy"), 2, "Error: 'sleepy' is not a status")
    one_line_error(run(srv, "ls", "--since", "soon"), 2, "Error: --since takes a duration")
    one_line_error(run(srv, "queue", "ls", "-t", "nosuch"), 3, "Error: No tenant 'nosuch'")
    one_line_error(run(srv, "token", "ls", "-t", "nosuch"), 3, "Error: No tenant 'nosuch'")
    one_line_error(run(srv, "ls", "-o", "yaml"), 2, "Error: ")


def test_every_listing_verb_takes_output(srv: tuple[LiveServer, dict[str, set[str]]]) -> None:
    assert lines(run(srv, "nodes", "ls", "-o", "name")) == ["n0", "n1"]
    nodes = json.loads(run(srv, "node", "ls", "-o", "json").stdout)
    assert [(n["name"], n["state"]) for n in nodes] == [("n0", "ready"), ("n1", "ready")]
    assert "DEVICE MEMORY" in run(srv, "node", "ls", "-o", "wide").stdout
    queue_names = ["default/default", "team-a/default", "team-a/held"]
    assert lines(run(srv, "queue", "ls", "-o", "name")) == queue_names
    queues = json.loads(run(srv, "queue", "ls", "-t", "Team-A", "-o", "json").stdout)
    assert [(q["name"], q["quota_gpus"]) for q in queues] == [("default", None), ("held", 1)]
    assert lines(run(srv, "tenant", "ls", "-o", "name")) == ["default", "team-a"]
    tenants = json.loads(run(srv, "tenant", "ls", "-o", "json").stdout)
    assert {t["name"] for t in tenants} == {"default", "team-a"}
    tokens = lines(run(srv, "token", "ls", "-o", "name"))
    assert tokens and all(t.startswith("tok-") for t in tokens)
    table = run(srv, "token", "ls")
    assert all(t in table.stdout for t in tokens)
    assert json.loads(run(srv, "token", "ls", "-t", "team-a", "-o", "json").stdout) == []
