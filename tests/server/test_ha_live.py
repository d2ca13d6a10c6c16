"""Two real `gpupool up --ha` servers on one PostgreSQL: a leader SIGSTOPped past its lease is
replaced and, resumed, writes nothing and follows (and a cancel it answers stops the pod that the
leader runs); a leader killed -9 is replaced, its pods
re-adopted, nothing started twice; a PostgreSQL restart answers 503 with Retry-After, then works,
and no server exits. One cluster for the module (the tests run in order on it)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from upproc import UpProcess, cli, until

from gpupool.client import Client
from gpupool.server import pgtemp
from ports import free_port

pytestmark = pytest.mark.slow
SHORT = {"GPUPOOL_LEASE_S": "3", "GPUPOOL_LEASE_RENEW_S": "0.5"}
"""The lease of the server a test stops or kills: the takeover waits it out."""
LONG = {"GPUPOOL_LEASE_S": "30", "GPUPOOL_LEASE_RENEW_S": "0.5"}
"""The lease of the server that takes over. The holder sets the expiry it writes (server/leader.py),
so this one keeps the lead through any hold-up a loaded machine gives it: with 3 s on both, a new
leader held up 2.5 s lost its lease to the resumed old one mid-test."""


@dataclass
class Cluster:
    pg: pgtemp.TempPostgres
    url: str
    servers: list[UpProcess]

    def leader(self, timeout_s: float = 30.0) -> tuple[UpProcess, int]:
        """The server holding the lease (as the store says), and its epoch; waits for one."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self._leader()
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise AssertionError("no leader")
            time.sleep(0.05)

    def _leader(self) -> tuple[UpProcess, int] | None:
        for server in self.servers:
            if server.proc is None or server.proc.poll() is not None:
                continue
            try:
                answer = server.client().get("/servers").json()
            except httpx.TransportError:
                continue
            for row in answer["servers"]:
                if row["leader"]:
                    port = int(row["address"].rsplit(":", 1)[1])
                    return next(s for s in self.servers if s.port == port), int(row["epoch"])
        return None

    def short_leader(self) -> tuple[UpProcess, int]:
        """The leader and its epoch, made the server with the SHORT lease while the other holds the
        LONG one, so that stopping it hands the lead to the other at once and for good. Where the
        LONG one leads (it took over in an earlier test, or when the machine held the SHORT one up),
        it is stopped cleanly (it gives its lease up: the other takes over within a renewal) and
        started again, following."""
        leader, epoch = self.leader()
        other = next(s for s in self.servers if s is not leader)
        if _lease(leader) == SHORT and _lease(other) == LONG:
            return leader, epoch
        if _lease(other) != SHORT:
            other.stop()
            other.env = {**(other.env or {}), **SHORT}
            other.start()
        leader.stop()
        until(lambda: self._leader() == (other, epoch + 1), 30, "the other server leading")
        leader.env = {**(leader.env or {}), **LONG}
        leader.start()
        return other, epoch + 1

    def sql(self, query: str, **params: object) -> list[tuple[object, ...]]:
        engine = create_engine(self.url)
        try:
            with engine.connect() as conn:
                return [tuple(r) for r in conn.execute(text(query), params)]
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = pgtemp.why_unavailable()
    if reason:
        pytest.skip(f"several servers need PostgreSQL: {reason}")
    pg = pgtemp.start(free_port=free_port)
    root = tmp_path_factory.mktemp("ha")
    servers: list[UpProcess] = []
    try:
        url = pg.create_database()
        for name, lease in (("a", SHORT), ("b", LONG)):  # one data directory: one pool (its token,
            # its agents' state); the first to start leads
            servers.append(UpProcess(root / "data", ["--ha", "--simulate", "1x8xH100"],
                                     env={"GPUPOOL_DATABASE_URL": url, **lease},
                                     log_path=root / f"{name}.log").start())
        yield Cluster(pg, url, servers)
    finally:
        for server in servers:
            if server.proc is not None and server.proc.poll() is None:
                try:
                    api = server.client()
                    for item in api.get("/workloads", params={"status": "running,pending"}).json()["items"]:
                        api.post(f"/workloads/{item['id']}/cancel")
                except httpx.HTTPError:
                    pass
                break
        for server in servers:
            server.stop()
        pg.stop()


def _lease(server: UpProcess) -> dict[str, str]:
    return {k: v for k, v in (server.env or {}).items() if k in SHORT}


def _submit(api: httpx.Client) -> str:
    answer = api.post("/workloads", json={"command": ["sleep", "300"], "resources": {"gpus": 1}})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _running(api: httpx.Client, *ids: str) -> bool:
    return all(api.get(f"/workloads/{w}").json()["status"] == "running" for w in ids)


def _launched(api: httpx.Client, wid: str) -> int:
    return [e["reason"] for e in api.get(f"/workloads/{wid}/events").json()].count("launched")


def _metric(server: UpProcess, name: str) -> float:
    text_ = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.token()}"},
                      timeout=30).text
    match = re.search(rf"^{name} (\S+)$", text_, re.M)
    return float(match.group(1)) if match else 0.0


def _announced(server: UpProcess) -> list[int]:
    """The epoch each node's agent keeps (agent/fencing.py), as the pool's data directory holds it."""
    return [int(p.read_text()) for p in sorted(server.data_dir.glob("agents/*/epoch"))]


def _is_leader(server: UpProcess) -> float:
    text_ = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.token()}"},
                      timeout=30).text
    match = re.search(r"^gpupool_is_leader (\S+)$", text_, re.M)
    assert match, text_[:400]
    return float(match.group(1))


def test_sigstopped_leader_is_replaced_and_resumed_writes_nothing(cluster: Cluster) -> None:
    old, epoch = cluster.short_leader()
    other = next(s for s in cluster.servers if s is not old)
    api = other.client()
    first = _submit(api)
    until(lambda: _running(api, first), 30, "the first workload running")
    assert old.proc is not None
    os.kill(old.proc.pid, signal.SIGSTOP)
    try:
        until(lambda: cluster._leader() == (other, epoch + 1), 30, "the other server leading")
        second = _submit(api)
        until(lambda: _running(api, second), 30, "work submitted meanwhile running")
    finally:
        os.kill(old.proc.pid, signal.SIGCONT)
    until(lambda: _is_leader(old) == 0, 30, "the resumed server following")
    third = old.client().post("/workloads", json={"command": ["sleep", "300"], "resources": {"gpus": 1}})
    assert third.status_code == 201, third.text  # a follower takes submissions; the leader places them
    until(lambda: _running(api, third.json()["id"]), 30, "work submitted to the follower running")
    until(lambda: _metric(other, "gpupool_follower_wakes_total") >= 1, 30,
          "the follower's submission waking the leader's loop (LISTEN/NOTIFY)")
    assert _is_leader(other) == 1
    scraped = httpx.get(f"{other.url}/metrics", headers={"Authorization": f"Bearer {other.token()}"}).text
    assert re.search(r"^gpupool_leader_changes_total 1\.0$", scraped, re.M), scraped[:400]
    renewals = re.search(r"^gpupool_lease_renew_seconds_count (\S+)$", scraped, re.M)
    assert renewals and float(renewals.group(1)) >= 1
    # the store: nothing written under the old epoch since the new one began
    (took,), = cluster.sql("SELECT acquired_s FROM leader_lease")
    stale = cluster.sql("SELECT id FROM pods WHERE epoch = :e AND created_s >= :t", e=epoch, t=took)
    assert stale == []
    assert cluster.sql("SELECT epoch FROM pods WHERE workload_id = :w", w=second) == [(epoch + 1,)]
    for wid in (first, second, third.json()["id"]):
        assert _launched(api, wid) == 1  # each started once
    assert cluster.sql("SELECT count(*) FROM pods WHERE status IN ('running', 'launching')") == [(3,)]
    # a cancel answered by the follower, of a pod launched after its agent last read the pods' state
    # (by the new leader): the leader, whose agent runs the pod, stops it
    cancelled = old.client().post(f"/workloads/{second}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
    until(lambda: cluster.sql("SELECT count(*) FROM pods WHERE workload_id = :w AND status IN "
                              "('stopping', 'running', 'launching')", w=second) == [(0,)],
          30, "the cancelled workload's pod (sleep 300) stopped by the leader")


def test_killed_leader_is_replaced_pods_adopted_none_started_twice(cluster: Cluster, tmp_path: Path) -> None:
    old, epoch = cluster.short_leader()
    other = next(s for s in cluster.servers if s is not old)
    api = other.client()
    running = [str(r[0]) for r in cluster.sql("SELECT workload_id FROM pods WHERE status = 'running'")]
    while len(running) < 2:  # the tests before leave two; chosen alone, this one starts its own
        started = _submit(api)
        until(lambda started=started: _running(api, started), 30, "work running before the kill")
        running = [str(r[0]) for r in cluster.sql("SELECT workload_id FROM pods WHERE status = 'running'")]
    assert len(running) == 2
    old.kill9()
    dead_url = old.url
    until(lambda: cluster._leader() == (other, epoch + 1), 30, "the other server leading after kill -9")
    # the CLI with both servers, the dead one first: it fails over and says who leads
    env = {"GPUPOOL_URL": f"{dead_url},{other.url}", "GPUPOOL_TOKEN": other.token()}
    listed = cli(["server", "ls"], env)
    assert listed.returncode == 0, listed.stderr
    assert "leader" in listed.stdout and str(epoch + 1) in listed.stdout
    submitted = cli(["submit", "--gpus", "1", "--", "sleep", "300"], env)
    assert submitted.returncode == 0, submitted.stderr
    new = submitted.stdout.strip().split()[-1]
    until(lambda: _running(api, new, *running), 30, "the new work running beside the adopted")
    for wid in running:
        reasons = [e["reason"] for e in api.get(f"/workloads/{wid}/events").json()]
        assert reasons.count("launched") == 1 and reasons[-1] == "adopted", reasons
    assert _launched(api, new) == 1
    old.start()  # back, as a follower
    until(lambda: _is_leader(old) == 0 and cluster.leader()[0] is other, 30, "the restarted server following")


def test_postgres_restart_answers_503_then_works_and_no_server_exits(cluster: Cluster) -> None:
    leader, _ = cluster.leader()
    api = leader.client()
    before = int(api.get("/workloads", params={"limit": 1}).json()["total"])
    cluster.pg.halt()
    try:
        down = api.post("/workloads", json={"command": ["true"]})
        assert down.status_code == 503, down.text
        assert down.headers["retry-after"] == "1"
        assert "store" in down.json()["message"]
    finally:
        threading.Timer(1.5, cluster.pg.resume).start()
    with Client(leader.url, leader.token()) as pool:  # retries the 503s until the store is back
        began = time.monotonic()
        wid = pool.submit(command=["true"])
        assert time.monotonic() - began < 30
        until(lambda: pool.workload(wid).status == "succeeded", 30, "work placed after the restart")
    assert int(api.get("/workloads", params={"limit": 1}).json()["total"]) == before + 1
    for server in cluster.servers:
        assert server.proc is not None and server.proc.poll() is None, server.log_text()[-2000:]
    until(lambda: sum(_is_leader(s) for s in cluster.servers) == 1, 30, "exactly one leader again")


def test_kill9_during_launches_starts_no_workload_twice(cluster: Cluster) -> None:
    # Launches in flight when the leader dies: the new leader requeues the rows it cannot see started,
    # and the nodes refuse whatever of the old epoch reaches them after its takeover (agent/fencing.py).
    # Counted from the pods' own start markers, not from the store.
    markers = Path(tempfile.mkdtemp(prefix="gpupool-markers-"))
    os.chmod(markers, 0o1777)  # the pods' accounts write their start markers here
    try:
        _burst_across_a_kill(cluster, markers)
    finally:
        shutil.rmtree(markers, ignore_errors=True)


def _burst_across_a_kill(cluster: Cluster, markers: Path) -> None:
    old, epoch = cluster.short_leader()
    other = next(s for s in cluster.servers if s is not old)
    api = other.client()
    marker = f'touch "{markers}/$GPUPOOL_WORKLOAD_ID.$$"; exec sleep 1'
    ids = []
    for _ in range(24):
        answer = api.post("/workloads", json={"command": ["sh", "-c", marker],
                                              "resources": {"gpus": 0.125}})
        assert answer.status_code == 201, answer.text
        ids.append(str(answer.json()["id"]))
    until(lambda: any(markers.iterdir()), 30, "the leader launching the burst")
    old.kill9()  # in the middle of the burst's launches
    until(lambda: cluster._leader() == (other, epoch + 1), 30, "the other server leading after kill -9")
    # its takeover announces its epoch to the node (before reading the node's records). The store's
    # lease names the new leader first, and the control loop takes over at its next step, after the
    # launches in flight let the node's epoch lock go: waited for, not read at once (a single read
    # found the old epoch on a loaded machine).
    until(lambda: _announced(other) == [epoch + 1], 30, "the new leader announcing its epoch to the node")
    final = {"succeeded", "failed", "cancelled"}
    until(lambda: all(api.get(f"/workloads/{w}").json()["status"] in final for w in ids), 120,
          "every workload of the burst ended")
    starts: dict[str, int] = {}
    for path in markers.iterdir():
        workload = path.name.rsplit(".", 1)[0]
        starts[workload] = starts.get(workload, 0) + 1
    assert set(starts) <= set(ids) and starts, starts
    assert max(starts.values()) == 1, {w: n for w, n in starts.items() if n > 1}
    succeeded = [w for w in ids if api.get(f"/workloads/{w}").json()["status"] == "succeeded"]
    assert all(starts.get(w) == 1 for w in succeeded)  # each one that ran, ran once
    old.start()
    until(lambda: _is_leader(old) == 0, 30, "the restarted server following")
