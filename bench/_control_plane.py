"""Helpers for the control-plane benchmarks: start `gpupool up` as a process, time, summarise."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx


@dataclass
class RunningServer:
    url: str
    token: str
    data_dir: Path
    pid: int

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server process has used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def gpupool_up(*args: str, open_files: tuple[int, int] | None = None) -> Iterator[RunningServer]:
    """A `gpupool up` process on a free loopback port with a fresh data directory; `open_files`:
    the (soft, hard) limit of open files it starts with (default: this process's)."""
    data_dir = Path(tempfile.mkdtemp(prefix="gpupool-bench-"))
    port = free_port()
    log = open(data_dir.parent / f"{data_dir.name}.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpupool.cli.main",
            "up",
            "--data-dir",
            str(data_dir),
            "--port",
            str(port),
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
        preexec_fn=None if open_files is None else partial(resource.setrlimit, resource.RLIMIT_NOFILE,
                                                           open_files),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/api/v1/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = Path(log.name).read_text(errors="replace").strip().splitlines()[-5:]
                raise RuntimeError(f"gpupool up did not start (exit {proc.poll()}): " + " | ".join(tail))
            time.sleep(0.1)
        token = (data_dir / "admin-token").read_text().strip()
        yield RunningServer(url=url, token=token, data_dir=data_dir, pid=proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have exited by itself
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        os.unlink(log.name)
        remove_pool_accounts(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def remove_pool_accounts(data_dir: Path) -> list[str]:
    """As root, remove the pod accounts a throwaway pool made (`gpupool-<pool id>-<tenant>`, the id in
    DATA_DIR/pool-id), so benches that start fresh pools do not pile up system accounts. An account
    still in use (a pod not ended yet) is left; stdlib only, so a run of an earlier commit works too."""
    import pwd

    try:
        pool = (data_dir / "pool-id").read_text().strip()
    except OSError:
        return []
    if os.geteuid() != 0 or not pool.isalnum():
        return []
    removed = []
    for entry in pwd.getpwall():
        if entry.pw_name.startswith(f"gpupool-{pool}-"):
            done = subprocess.run(["userdel", entry.pw_name], capture_output=True, check=False)
            if done.returncode == 0:
                removed.append(entry.pw_name)
    return removed


PLAIN_SPEC: dict[str, object] = {"command": ["true"], "resources": {"gpus": 0.25}}
COHORT_TENANTS = ("team-a", "team-b", "team-c")
MIXES = ("plain", "cohort")
ROUTINE_REASONS = frozenset({"submitted", "admitted", "launched", "completed"})
"""Event reasons every workload of the benches records; the rest are what the mix made happen."""


def workload_mix(mix: str) -> list[dict[str, object]]:
    """The specs a bench submits in turn (submission i sends spec i % len).

    plain: `true` at 0.25 GPU from the admin's own tenant (the benches' historical figures).
    cohort: 20 specs of `true` over the three tenants of bench/configs/live-full-*.yaml (team-a
    half, team-b and team-c a quarter each), in the classes best-effort, normal and high (a fifth,
    three fifths, a fifth), one in ten a whole device with a 60 s time limit (the rest 0.25 GPU):
    work that borrows within the cohort, may preempt across classes, and gives backfill a head
    whose reservation others run around. The admin submits on each tenant's behalf.
    """
    if mix == "plain":
        return [PLAIN_SPEC]
    if mix != "cohort":
        raise SystemExit(f"unknown mix {mix!r}; choose one of {', '.join(MIXES)}")
    tenants = ("team-a", "team-a", "team-b", "team-c")
    classes = ("normal", "best-effort", "normal", "high", "normal")
    specs: list[dict[str, object]] = []
    for i in range(20):
        whole = i % 10 == 9
        spec: dict[str, object] = {"command": ["true"], "tenant": tenants[i % 4],
                                   "priority_class": classes[i % 5],
                                   "resources": {"gpus": 1 if whole else 0.25}}
        if whole:
            spec["time_limit_s"] = 60
        specs.append(spec)
    return specs


def ensure_tenants(server: RunningServer, mix: str) -> None:
    """Create the mix's tenants the configuration did not (each with its `default` queue, no quota)."""
    if mix != "cohort":
        return
    headers = {"Authorization": f"Bearer {server.token}"}
    with httpx.Client(base_url=server.url, headers=headers) as c:
        have = {t["name"] for t in c.get("/api/v1/tenants").raise_for_status().json()}
        for name in COHORT_TENANTS:
            if name not in have:
                c.post("/api/v1/tenants", json={"name": name}).raise_for_status()


def unusual_events(server: RunningServer) -> dict[str, int]:
    """How many events of each reason other than the routine ones the store holds (preemptions,
    requeues, time limits, ...): read from the SQLite file (empty for another store)."""
    path = server.data_dir / "gpupool.sqlite"
    if not path.exists():
        return {}
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
        rows = db.execute("SELECT reason, count(*) FROM events GROUP BY reason").fetchall()
    return {str(r): int(n) for r, n in sorted(rows) if r not in ROUTINE_REASONS}


def submit_to_running_s(server: RunningServer) -> list[float]:
    """Each started workload's seconds from its submission to its start (workloads.started_s -
    submit_s), read from the SQLite file (empty for another store)."""
    path = server.data_dir / "gpupool.sqlite"
    if not path.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
        rows = db.execute("SELECT started_s - submit_s FROM workloads WHERE started_s IS NOT NULL").fetchall()
    return [float(r) for (r,) in rows]


def cycle_totals(server: RunningServer) -> tuple[int, float]:
    """(scheduling cycles that had pending work, their seconds in all), from the server's /metrics."""
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.token}"}).text
    figures = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("gpupool_scheduling_cycle_duration_seconds_count",
                    "gpupool_scheduling_cycle_duration_seconds_sum"):
            figures[name.rsplit("_", 1)[1]] = float(value)
    return int(figures.get("count", 0)), figures.get("sum", 0.0)


def percentile_ms(samples_s: Sequence[float], q: float) -> float:
    ordered = sorted(samples_s)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index] * 1000


def p50_ms(samples_s: Sequence[float]) -> float:
    return statistics.median(samples_s) * 1000 if samples_s else float("nan")


def write_json(path: str, name: str, payload: dict[str, object]) -> Path:
    out = Path(path or Path(__file__).parent / "results" / f"{name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))
    return out


class RawHttpClient:
    """A minimal HTTP/1.1 keep-alive client over asyncio streams, for load generation only.

    httpx's async client spends about as much CPU per request as the server under test does, so
    on a 2-core machine a load generator built on it measures itself; this one sends pre-built
    request bytes and reads back only the status line, Content-Length and body.
    """

    def __init__(self, url: str) -> None:
        host_port = url.split("://", 1)[1].rstrip("/")
        self.host, _, port = host_port.partition(":")
        self.port = int(port or 80)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    def request_bytes(self, method: str, path: str, token: str, payload: object) -> bytes:
        body = json.dumps(payload).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n")
        return head.encode() + body

    async def send(self, request: bytes) -> tuple[int, bytes]:
        """Send one pre-built request on this connection (opened on first use); (status, body)."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        self._writer.write(request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self._reader.readexactly(length)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
