"""Issue 38 item 6: a CLI that fits a terminal. On a live `gpupool up --simulate` pool: one line per
workload in `ls` at 80 columns (short node names, `(sim)` said once), tables whole when piped, `-o json`
for show, audit, usage and invoice, `node ls` without the enforcement table unless `-o wide`, and an
unenforced limit said once per node rather than as events on every workload."""

from __future__ import annotations

import io
import json
import os
import pathlib
import pty
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator

import pytest

from cli.cliproc import gpupool
from gpupool.client import Client
from server.upproc import UpProcess, until

pytestmark = pytest.mark.slow
LONG_NAME = "a-name-long-enough-to-be-wrapped-by-an-80-column-table-" + "x" * 8
LONG_TENANT = "a-tenant-whose-name-runs-past-eighty-columns-in-a-table"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LONG_COHORT = "a-cohort-whose-name-would-push-the-queue-table-past-eighty"
BOX = set("┏┓┗┛━┃│┡┩╇╈┳┻─")
LISTS = [("node", "ls"), ("queue", "ls"), ("tenant", "ls"), ("token", "ls"), ("image", "ls"),
         ("secret", "ls")]


def _rootfs(base: pathlib.Path) -> pathlib.Path:
    """A one-file root filesystem as a tar: enough for `image import`."""
    archive = base / "tiny.tar"
    with tarfile.open(archive, "w") as tar:
        data = b"#!/bin/sh\n"
        member = tarfile.TarInfo("bin/sh")
        member.size, member.mode = len(data), 0o755
        tar.addfile(member, io.BytesIO(data))
    return archive


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[UpProcess, dict[str, str]]]:
    base = tmp_path_factory.mktemp("fits")
    server = UpProcess(base / "data", ["--simulate", "2x8xH100", "--placement", "first-fit"]).start()
    try:
        with Client(server.url, server.token()) as api:
            api.create_tenant(LONG_TENANT)
            api.create_queue("default", "research", 4, cohort=LONG_COHORT)
            token = api.create_token("default", "ci-" + "t" * 40).token
            with Client(server.url, token) as own:  # the tenant's own token writes its secrets
                own.create_secret("registry", {f"KEY_{i}_" + "K" * 12: "v" for i in range(6)})
            api.import_image(_rootfs(base), "tiny")
            ids = {
                "long": api.submit({"command": ["sleep", "600"], "name": LONG_NAME,
                                    "resources": {"gpus": 1}}),
                "share": api.submit({"command": ["sleep", "600"], "name": "share",
                                     "resources": {"gpus": 0.5, "cpu": 1}}),
                "whole": api.submit({"command": ["sleep", "600"], "name": "whole", "resources": {"gpus": 2}}),
                "waits": api.submit({"command": ["true"], "name": "too-big", "replicas": 3,
                                     "resources": {"gpus": 8}}),
                "other": api.submit({"command": ["sleep", "600"], "tenant": LONG_TENANT,
                                     "resources": {"gpus": 1}}),
            }
            running = [ids["long"], ids["share"], ids["whole"], ids["other"]]
            until(lambda: all(api.workload(w).status == "running" for w in running), 60, "the work to run")
        yield server, ids
        with Client(server.url, server.token()) as api:  # pods outlive their server: stop them first
            for wid in ids.values():
                if api.workload(wid).status not in ("succeeded", "failed", "cancelled"):
                    api.cancel(wid)
            until(lambda: all(api.workload(w).status in ("succeeded", "failed", "cancelled")
                              for w in ids.values()), 60, "the work to stop")
    finally:
        server.stop()


def run(pool: tuple[UpProcess, dict[str, str]], *args: str) -> str:
    server, _ = pool
    result = gpupool(server.url, server.token(), *args)
    assert (result.returncode, result.stderr) == (0, ""), (args, result.returncode, result.stderr)
    return result.stdout


def on_terminal(pool: tuple[UpProcess, dict[str, str]], *args: str, columns: int = 80) -> list[str]:
    """The lines `gpupool ARGS` prints on a terminal `columns` wide (a pseudo-terminal), colours removed."""
    server, _ = pool
    leader, follower = pty.openpty()
    env = {**os.environ, "GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token(),
           "COLUMNS": str(columns), "LINES": "50", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", *args], stdout=follower,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closes when the command exits
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    text = ANSI.sub("", b"".join(chunks).decode())
    return [line.rstrip() for line in text.replace("\r\n", "\n").split("\n") if line.strip()]


def test_ls_is_one_line_per_workload_at_80_columns(pool: tuple[UpProcess, dict[str, str]]) -> None:
    _, ids = pool
    lines = on_terminal(pool, "ls")
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    for wid in ids.values():  # each workload is on exactly one line, its id whole
        assert sum(wid in line for line in lines) == 1, (wid, lines)
    rows = [line for line in lines if line.startswith("w-")]
    assert len(rows) == len(ids)
    assert not any("h100-sxm-80gb-" in row or "(sim)" in row for row in rows), rows  # short node names
    assert "NODE: names after h100-sxm-80gb-" in lines
    assert sum("(sim)" in line for line in lines) == 1  # said once, under the table
    assert any("…" in row for row in rows if ids["long"] in row)  # the long name is cut to fit
    assert any("…" in row for row in rows if ids["other"] in row)  # and the long tenant/queue
    assert "QUEUE" in lines[1] and "in default/default" not in lines[0]  # two queues: a column


def test_ls_names_the_one_queue_in_its_title(pool: tuple[UpProcess, dict[str, str]]) -> None:
    _, ids = pool
    lines = on_terminal(pool, "ls", "-t", "default")
    assert "in default/default" in lines[0] and "QUEUE" not in lines[1]
    assert ids["other"] not in "\n".join(lines) and ids["long"] in "\n".join(lines)


def test_piped_tables_take_the_width_they_need(pool: tuple[UpProcess, dict[str, str]]) -> None:
    _, ids = pool
    listing = run(pool, "ls")
    assert listing.count(LONG_NAME) == 1 and "…" not in listing  # COLUMNS=80, but a pipe: never cut
    assert all(wid in listing for wid in ids.values())
    shown = run(pool, "show", ids["long"])
    assert LONG_NAME in shown and "…" not in shown
    assert max(len(line) for line in shown.splitlines()) > 80  # the pods table was cut at 80 before
    audit = run(pool, "audit")
    assert any(LONG_TENANT in line for line in audit.splitlines()) and "…" not in audit
    usage = run(pool, "usage", "--by", "tenant,queue,model,priority_class")
    assert "DEDICATED USD" in usage and "PRIORITY_CLASS" in usage and "…" not in usage
    profiles = run(pool, "profile", "ls")
    assert "…" not in profiles and max(len(line) for line in profiles.splitlines()) > 80


def test_o_json_for_show_audit_usage_and_invoice(pool: tuple[UpProcess, dict[str, str]]) -> None:
    _, ids = pool
    shown = json.loads(run(pool, "show", ids["share"], "-o", "json"))
    assert shown["id"] == ids["share"] and shown["status"] == "running"
    both = json.loads(run(pool, "show", ids["share"], ids["whole"], "-o", "json"))
    assert [w["id"] for w in both] == [ids["share"], ids["whole"]]
    assert run(pool, "show", ids["share"], "-o", "name") == ids["share"] + "\n"
    audit = json.loads(run(pool, "audit", "-o", "json"))
    assert any(r["action"] == "tenant.create" and r["target"] == LONG_TENANT for r in audit), audit
    usage = json.loads(run(pool, "usage", "-o", "json"))
    assert usage and all(r["currency"] == "USD" and "cost" in r for r in usage)
    month = time.strftime("%Y-%m", time.gmtime())
    invoice = json.loads(run(pool, "invoice", "--tenant", "default", "--month", month, "-o", "json"))
    *lines, total = invoice  # the lines, then the total
    assert lines and {r["model"] for r in lines} == {"H100-SXM-80GB"} and total["model"] == "TOTAL"
    server, _ = pool
    refused = gpupool(server.url, server.token(), "usage", "-o", "json", "--csv")
    assert refused.returncode == 2 and refused.stderr.startswith("Error: Give one output format")


def test_node_ls_shows_the_enforcement_table_only_wide(pool: tuple[UpProcess, dict[str, str]]) -> None:
    plain = run(pool, "node", "ls")
    assert "LAYER" not in plain and "enforcement" not in plain
    rows = [line for line in plain.splitlines() if "h100-sxm-80gb-00" in line]
    assert len(rows) == 2 and all("device_limits" in row for row in rows)  # once per node, in a column
    wide = run(pool, "node", "ls", "-o", "wide")
    assert "LAYER" in wide and "enforcement" in wide
    assert sum("device_limits" in line and "simulated devices" in line for line in wide.splitlines()) == 2
    shown = run(pool, "node", "show", "h100-sxm-80gb-000")
    assert "device_limits" in shown and "simulated devices" in shown


def test_unenforced_limits_are_said_per_node_not_per_workload(pool: tuple[UpProcess, dict[str, str]]) -> None:
    server, ids = pool
    with Client(server.url, server.token()) as api:
        for wid in (ids["share"], ids["long"], ids["whole"]):
            events = api.events(wid)
            assert [e.reason for e in events if e.reason == "limits_unenforced"] == [], events
        node = api.workload(ids["share"]).pods[0].node
    shown = run(pool, "show", ids["share"])
    said = [line for line in shown.splitlines() if line.startswith("not enforced:")]
    device = (f"not enforced: device compute and memory limits are not enforced on node {node}: simulated "
              "devices: compute and memory shares are accounted, not enforced")
    host = [s for s in said if s.startswith("not enforced: host cpu and memory limits")]  # without cgroup v2
    assert said == [device, *host] and len(host) <= 1, said
    assert "limits_unenforced" not in shown


def keys_of(pool: tuple[UpProcess, dict[str, str]], command: tuple[str, ...]) -> list[str]:
    """What `-o name` says each row of COMMAND is keyed by (its first cell: a name, an id)."""
    return [name.rpartition("/")[2] if command[0] == "secret" else name
            for name in run(pool, *command, "-o", "name").split()]


@pytest.mark.parametrize("command", LISTS, ids=[" ".join(c) for c in LISTS])
def test_every_list_is_plain_columns_that_fit_80(pool: tuple[UpProcess, dict[str, str]],
                                                   command: tuple[str, ...]) -> None:
    """Issue 38 item 6: each list command prints kubectl-style columns (no box), one line a row at
    80 columns, the key of each row whole."""
    lines = on_terminal(pool, *command)
    assert not BOX & set("".join(lines)), "\n".join(lines)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    keys = keys_of(pool, command)
    assert keys, command
    header = lines[1]
    assert header.split()[0] in ("NODE", "TENANT/QUEUE", "TENANT", "ID", "NAME"), header
    for key in keys:  # one line per row, starting with its key, whole
        assert sum(line.startswith(key + " ") for line in lines) == 1, (key, lines)


def test_long_cells_are_cut_on_a_terminal_and_whole_when_piped(
        pool: tuple[UpProcess, dict[str, str]]) -> None:
    queues = on_terminal(pool, "queue", "ls")
    (research,) = [line for line in queues if line.startswith("default/research ")]
    assert "…" in research and LONG_COHORT not in research
    piped = run(pool, "queue", "ls")
    assert LONG_COHORT in piped and "…" not in piped and not BOX & set(piped)
    secrets = on_terminal(pool, "secret", "ls")
    assert any(line.startswith("registry ") and "…" in line for line in secrets), secrets
    assert "KEY_5_" + "K" * 12 in run(pool, "secret", "ls")
    tenants = run(pool, "tenant", "ls")
    assert any(line.startswith(LONG_TENANT + " ") for line in tenants.splitlines())
    wide = on_terminal(pool, "queue", "ls", "-o", "wide")  # every cell whole, the terminal wraps
    assert LONG_COHORT in "".join(wide) and "…" not in "".join(wide) and not BOX & set("".join(wide))


def test_node_show_fits_80_and_is_whole_piped(pool: tuple[UpProcess, dict[str, str]]) -> None:
    lines = on_terminal(pool, "node", "show", "h100-sxm-80gb-000")
    assert all(len(line) <= 80 for line in lines) and not BOX & set("".join(lines)), "\n".join(lines)
    assert any(line.startswith("device_limits ") and "…" in line for line in lines), lines  # the reason cut
    piped = run(pool, "node", "show", "h100-sxm-80gb-000")
    assert "simulated devices: compute and memory shares are accounted, not enforced" in piped
    assert "…" not in piped
