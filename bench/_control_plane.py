"""Helpers for the control-plane benchmarks: start `gpupool up` as a process, time, summarise."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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
def gpupool_up(*args: str) -> Iterator[RunningServer]:
    """A `gpupool up` process on a free loopback port with a fresh data directory."""
    data_dir = Path(tempfile.mkdtemp(prefix="gpupool-bench-"))
    port = free_port()
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
        stderr=subprocess.DEVNULL,
        start_new_session=True,
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
                raise RuntimeError(f"gpupool up did not start (exit {proc.poll()})")
            time.sleep(0.1)
        token = (data_dir / "admin-token").read_text().strip()
        yield RunningServer(url=url, token=token, data_dir=data_dir, pid=proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


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
