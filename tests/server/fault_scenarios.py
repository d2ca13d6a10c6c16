"""Fault scenarios against a real `gpupool up`, shared by tests/server/test_faults.py (small) and
bench/faults.py (full size): each injects one fault and returns what it observed."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from upproc import UpProcess, until

ACTIVE = ("pending", "admitted", "running")
STARTED_LINE = "started"


@dataclass
class Kill9Outcome:
    """What a kill -9 during a flood of submissions left behind, after a restart."""

    submitted: int
    acknowledged: list[str] = field(default_factory=list)
    cut: int = 0
    """Submissions whose connection broke (never acknowledged; stored or not, either is correct)."""
    refused: int = 0
    """Submissions answered with an error status before the kill."""
    missing_after_restart: list[str] = field(default_factory=list)
    stored_after_restart: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    most_launches: int = 0
    """The largest number of `launched` events of one workload (1 = never started twice)."""
    most_pod_dirs: int = 0
    """The largest number of pods (attempts) the agent set up for one workload (a lost pod is not
    started again unless its workload asked for retries)."""
    most_started_pods: int = 0
    """The largest number of pods of one workload whose process ran (printed its start line)."""
    most_started_lines: int = 0
    """The largest number of times one pod's process printed its start line."""
    seconds: float = 0.0


def kill9_during_submissions(workdir: Path, n: int, *, kill_at_fraction: float = 0.4,
                             connections: int = 64) -> Kill9Outcome:
    """Post `n` submissions as fast as possible; SIGKILL the server once kill_at_fraction of them were
    acknowledged; restart it on the same data dir and let every stored workload finish."""
    began = time.monotonic()
    server = UpProcess(workdir / "data", ["--simulate", "1x8xH100", "--placement", "first-fit"],
                       log_path=workdir / "server.log")
    outcome = Kill9Outcome(submitted=n)
    try:
        server.start()
        asyncio.run(_flood(server, n, max(1, int(n * kill_at_fraction)), connections, outcome))
        assert server.proc is not None
        server.proc.wait(timeout=30)
        server.start()  # same data dir, same port
        with server.client() as api:
            for workload_id in outcome.acknowledged:
                if api.get(f"/workloads/{workload_id}").status_code != 200:
                    outcome.missing_after_restart.append(workload_id)

            def settled() -> bool:
                answer = api.get("/workloads", params={"status": list(ACTIVE), "limit": 1})
                return answer.status_code == 200 and answer.json()["total"] == 0

            until(settled, 60 + n * 0.2, "every stored workload finished")
    finally:
        server.stop()
    _inspect(server.data_dir, outcome)
    outcome.seconds = time.monotonic() - began
    return outcome


async def _flood(server: UpProcess, n: int, kill_after: int, connections: int, outcome: Kill9Outcome) -> None:
    assert server.proc is not None
    pid = server.proc.pid
    spec = {"command": ["echo", STARTED_LINE], "resources": {"gpus": 0}}
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    # At most `connections` requests at once, as the pool's limit allows anyway: the rest wait here
    # rather than in httpcore's queue, which it scans whole for every request it starts or ends
    # (with all n queued there, the flood cost the test process 3 times the CPU of the requests).
    gate = asyncio.Semaphore(connections)
    async with httpx.AsyncClient(base_url=server.api, limits=limits, timeout=60,
                                 headers={"Authorization": f"Bearer {server.token()}"}) as api:

        async def one() -> None:
            try:
                async with gate:
                    answer = await api.post("/workloads", json=spec)
            except httpx.TransportError:
                outcome.cut += 1
                return
            if answer.status_code != 201:
                outcome.refused += 1
                return
            outcome.acknowledged.append(str(answer.json()["id"]))
            if len(outcome.acknowledged) == kill_after:
                os.kill(pid, signal.SIGKILL)

        await asyncio.gather(*(one() for _ in range(n)))


def _inspect(data_dir: Path, outcome: Kill9Outcome) -> None:
    """Read the stopped server's store and agent state directly."""
    with sqlite3.connect(data_dir / "gpupool.sqlite") as db:
        outcome.stored_after_restart = db.execute("SELECT count(*) FROM workloads").fetchone()[0]
        outcome.statuses = dict(db.execute("SELECT status, count(*) FROM workloads GROUP BY status"))
        launches = db.execute("SELECT count(*) FROM events WHERE reason = 'launched' GROUP BY workload_id "
                              "ORDER BY 1 DESC LIMIT 1").fetchone()
    outcome.most_launches = launches[0] if launches else 0
    pods_per_workload: collections.Counter[str] = collections.Counter()
    started_per_workload: collections.Counter[str] = collections.Counter()
    for pod_dir in data_dir.glob("agents/*/pods/*"):
        workload_id = pod_dir.name.rsplit("-a", 1)[0]
        pods_per_workload[workload_id] += 1
        try:
            lines = (pod_dir / "stdout.log").read_text().splitlines()
        except OSError:
            lines = []
        started_per_workload[workload_id] += STARTED_LINE in lines
        outcome.most_started_lines = max(outcome.most_started_lines, lines.count(STARTED_LINE))
    outcome.most_pod_dirs = max(pods_per_workload.values(), default=0)
    outcome.most_started_pods = max(started_per_workload.values(), default=0)


# ---- the store's disk full -------------------------------------------------------------------

@dataclass
class DiskFullOutcome:
    acknowledged_while_filling: int = 0
    """Submissions the store still took while the disk filled (room left in its write-ahead log)."""
    submit_status: int = 0
    submit_body: dict[str, object] = field(default_factory=dict)
    route_write_status: int = 0
    """A write through the ordinary FastAPI route (creating a tenant)."""
    cli_exit: int = 0
    cli_stderr: str = ""
    read_statuses: list[int] = field(default_factory=list)
    failure_log_lines: int = 0
    tracebacks: int = 0
    recovered_status: int = 0
    recovery_log_lines: int = 0
    integrity: str = ""
    stored: int = 0
    expected_stored: int = 0


def mount_tmpfs(where: Path, size_mib: int) -> None:
    import subprocess

    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(where)],
                   check=True, capture_output=True)


def umount(where: Path) -> None:
    import subprocess

    subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


def fill(path: Path) -> None:
    """Write `path` until its filesystem has no byte left (ENOSPC), smaller and smaller chunks."""
    with open(path, "ab", buffering=0) as handle:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9):
            block = b"\0" * chunk
            try:
                while True:
                    handle.write(block)
            except OSError:
                continue


def disk_full(workdir: Path, mount_point: Path, cli_env: dict[str, str]) -> DiskFullOutcome:
    """The store on a small tmpfs that the test fills, then empties (needs root: see mount_tmpfs)."""
    from upproc import cli

    outcome = DiskFullOutcome()
    server = UpProcess(mount_point / "data", ["--provider", "fake", "--simulate", "1x2xH100"],
                       log_path=workdir / "server.log")
    spec = {"command": ["true"], "env": {"GPUPOOL_FAKE_DURATION_S": "0"}}
    db_path = server.data_dir / "gpupool.sqlite"
    try:
        server.start()
        with server.client() as api:
            ids = [api.post("/workloads", json=spec).json()["id"] for _ in range(3)]

            def all_final() -> bool:
                return api.get("/workloads", params={"status": list(ACTIVE)}).json()["total"] == 0

            until(all_final, 60, "the first workloads finished")
            with sqlite3.connect(db_path) as db:  # an empty write-ahead log: the next write needs room
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            fill(mount_point / "filler")
            for _ in range(2000):  # bounded: the log's room left runs out within a few hundred rows
                answer = api.post("/workloads", json=spec)
                if answer.status_code != 201:
                    break
                outcome.acknowledged_while_filling += 1
            outcome.submit_status, outcome.submit_body = answer.status_code, answer.json()
            for _ in range(5):  # repeated failures log nothing more
                api.post("/workloads", json=spec)
            outcome.route_write_status = api.post("/tenants", json={"name": "full"}).status_code
            refused = cli(["submit", "--", "true"], {**cli_env, "GPUPOOL_URL": server.url,
                                                    "GPUPOOL_TOKEN": server.token()})
            outcome.cli_exit, outcome.cli_stderr = refused.returncode, refused.stderr
            outcome.read_statuses = [api.get(path).status_code
                                     for path in ("/workloads", f"/workloads/{ids[0]}", "/pool")]
            (mount_point / "filler").unlink()
            answer = api.post("/workloads", json=spec)
            outcome.recovered_status = answer.status_code
            outcome.expected_stored = 3 + outcome.acknowledged_while_filling + (answer.status_code == 201)
    finally:
        server.stop()
        log = server.log_text()
        outcome.failure_log_lines = log.count("the store failed")
        outcome.recovery_log_lines = log.count("the store works again")
        outcome.tracebacks = log.count("Traceback")
        if db_path.exists():
            with sqlite3.connect(db_path) as db:
                outcome.integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
                outcome.stored = db.execute("SELECT count(*) FROM workloads").fetchone()[0]
    return outcome


# ---- pods that resist being stopped ------------------------------------------------------------

MARK_VARIABLE = "GPUPOOL_FAULT_MARK"


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    command: str


def marked_processes(mark: str) -> list[Proc]:
    """Live (not zombie) processes whose environment carries MARK_VARIABLE=mark, read from /proc."""
    needle = f"{MARK_VARIABLE}={mark}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                if needle not in handle.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
            with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[1].split()
        if fields[0] == b"Z":
            continue
        found.append(Proc(pid=int(entry.name), ppid=int(fields[1]), pgid=int(fields[2]), sid=int(fields[3]),
                          command=command))
    return found


def kill_marked(mark: str) -> None:
    """Leave nothing behind, whatever the scenario found."""
    for proc in marked_processes(mark):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGKILL)


@dataclass
class CancelOutcome:
    peak_processes: int = 0
    status: str = ""
    left: list[Proc] = field(default_factory=list)


LEFTOVER_GRACE_S = 30.0
"""How long after the cancel is seen the pod's last processes may take to go: the agent's next sweep
(its reaper thread's, or the server's next poll), on a machine whose cores the test run shares; a
leftover the agent misses lives on for its whole `sleep 120`, so this still tells the two apart."""


def cancel_resisting_pod(server: UpProcess, script: str, *, expect_processes: int) -> CancelOutcome:
    """Run `sh -c script` as a pod, wait until it has expect_processes processes, cancel it, and
    report which of its processes are left once its process group is gone."""
    import uuid

    mark = uuid.uuid4().hex
    outcome = CancelOutcome()
    try:
        with server.client() as api:
            spec = {"command": ["sh", "-c", script], "env": {MARK_VARIABLE: mark}}
            answer = api.post("/workloads", json=spec)
            assert answer.status_code == 201, answer.text
            workload_id = answer.json()["id"]
            until(lambda: len(marked_processes(mark)) >= expect_processes, 120,
                  f"{expect_processes} processes")
            before = marked_processes(mark)
            outcome.peak_processes = len(before)
            pids = {proc.pid for proc in before}
            groups = {proc.pgid for proc in before if proc.ppid not in pids}  # the group the agent started
            assert api.post(f"/workloads/{workload_id}/cancel").status_code == 200
            until(lambda: not any(p.pgid in groups for p in marked_processes(mark)), 60, "its group ended")
            until(lambda: api.get(f"/workloads/{workload_id}").json()["status"] == "cancelled", 60,
                  "the workload cancelled")
            outcome.status = "cancelled"
            # The agent kills what left the group once it has reaped the pod's main process, in
            # its reaper thread: give it a bounded moment rather than racing it.
            with contextlib.suppress(AssertionError):
                until(lambda: not marked_processes(mark), LEFTOVER_GRACE_S, "no process of the pod left")
            outcome.left = marked_processes(mark)
    finally:
        kill_marked(mark)
    return outcome


# ---- the agent killed while pods run ------------------------------------------------------------

@dataclass
class AgentKillOutcome:
    pods: int = 0
    survived_kill: int = 0
    """Pod processes still alive after the server (and its in-process agent) died."""
    adopted: int = 0
    statuses: list[str] = field(default_factory=list)
    most_launches: int = 0
    most_started_lines: int = 0
    same_processes: bool = False
    """The processes that finished are the ones started before the kill (none started again)."""


def agent_killed_while_pods_run(workdir: Path, pods: int = 3) -> AgentKillOutcome:
    """kill -9 the server (the local provider's agent runs in it) while `pods` workloads run; restart;
    let them finish by creating the file they wait for (a world-readable place: pods may run as
    another account); each waits at most 60 s by itself."""
    import tempfile
    import uuid

    mark = uuid.uuid4().hex
    gate = Path(tempfile.mkdtemp(prefix="gpupool-gate-"))
    gate.chmod(0o755)
    release = gate / "release"
    script = (f"echo {STARTED_LINE}; i=0; while [ ! -e {release} ] && [ $i -lt 300 ]; do sleep 0.2; "
              "i=$((i+1)); done")
    outcome = AgentKillOutcome(pods=pods)
    server = UpProcess(workdir / "data", ["--simulate", f"1x{pods}xH100", "--placement", "first-fit"],
                       log_path=workdir / "server.log")
    try:
        server.start()
        with server.client() as api:
            spec = {"command": ["sh", "-c", script], "resources": {"gpus": 1}, "env": {MARK_VARIABLE: mark}}
            ids = [api.post("/workloads", json=spec).json()["id"] for _ in range(pods)]

            def started() -> bool:
                # running, not only printing: the launch is recorded, so the kill below falls while
                # the pods run (a kill between a pod's start and that record leaves no `launched`
                # event to count, only the adoption)
                return all(STARTED_LINE in api.get(f"/workloads/{w}/logs").json()["text"]
                           and api.get(f"/workloads/{w}").json()["status"] == "running" for w in ids)

            until(started, 60, "every pod started and recorded running")
        before = _leaders(mark)
        server.kill9()
        outcome.survived_kill = len(_leaders(mark) & before)
        server.start()
        with server.client() as api:
            until(lambda: all(api.get(f"/workloads/{w}").json()["status"] == "running" for w in ids), 60,
                  "the pods re-adopted")
            events = [api.get(f"/workloads/{w}/events").json() for w in ids]
            outcome.adopted = sum(any(e["reason"] == "adopted" for e in evs) for evs in events)
            after = _leaders(mark)
            release.touch()
            until(lambda: all(api.get(f"/workloads/{w}").json()["status"] not in ACTIVE for w in ids), 60,
                  "the pods finished")
            outcome.statuses = [api.get(f"/workloads/{w}").json()["status"] for w in ids]
            events = [api.get(f"/workloads/{w}/events").json() for w in ids]
            outcome.most_launches = max(sum(e["reason"] == "launched" for e in evs) for evs in events)
            outcome.most_started_lines = max(
                api.get(f"/workloads/{w}/logs").json()["text"].splitlines().count(STARTED_LINE) for w in ids)
            outcome.same_processes = after == before
    finally:
        release.touch()
        server.stop()
        kill_marked(mark)
        release.unlink(missing_ok=True)
        gate.rmdir()
    return outcome


def _leaders(mark: str) -> set[int]:
    """The pods' process group leaders (their shims) among the marked processes."""
    return {p.pid for p in marked_processes(mark) if p.pid == p.pgid}
