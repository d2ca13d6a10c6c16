"""A real `gpupool up` process on a free loopback port: started, killed -9 and restarted by fault tests."""

from __future__ import annotations

import functools
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from cli_inproc import run_cli
from gpupool.federation.loopback import Process, popen_gpupool
from ports import free_port
from zygote import Forked, Zygote, usable

START_TIMEOUT_S = 90.0
FORKED = os.environ.get("GPUPOOL_TEST_FORK_SERVER", "1") != "0"
"""Whether servers are forked from the worker's fork server by default (GPUPOOL_TEST_FORK_SERVER=0:
each its own `python -m gpupool.cli.main up`, to compare)."""


def spawn_gpupool(argv: list[str], env: dict[str, str], log: Path) -> Process:
    """A loopback federation's `Spawn` through the worker's fork server, as `UpProcess` starts its
    servers (a fresh interpreter with GPUPOOL_TEST_FORK_SERVER=0, or where `env` changes how one
    starts)."""
    if FORKED and usable(env):
        return Zygote.shared().spawn(argv, env, log)
    return popen_gpupool(argv, env, log)


def until(predicate: Callable[[], object], timeout_s: float = 60.0, what: str = "condition") -> None:
    """Poll `predicate` until it is true (connection errors count as false); bounded by timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s:g} s")
        time.sleep(0.05)


def default_ssl_context() -> ssl.SSLContext:
    """httpx's context for verify=True (SSL_CERT_FILE or SSL_CERT_DIR when set, else certifi's CAs),
    built once per setting: loading the CAs costs ~17 ms of CPU, and tests make a client every poll."""
    return _ssl_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _ssl_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    return httpx.create_ssl_context()


class UpProcess:
    """`gpupool up --data-dir DIR --port PORT ARGS...`, its output appended to DIR/../<name>.log.
    Forked from the worker's fork server (`zygote.py`: the same server, without a second of imports
    per start) unless `forked` (default `FORKED`) is False (a test that reads the server's own
    /proc/PID/cmdline or environ, which a forked child shares with the fork server) or the
    environment changes how Python starts."""

    def __init__(self, data_dir: Path, args: Sequence[str] = (), *, log_path: Path | None = None,
                 env: dict[str, str] | None = None, verify: ssl.SSLContext | bool = True,
                 forked: bool | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.args = list(args)
        self.log_path = log_path or data_dir.parent / f"{data_dir.name}-server.log"
        self.env = env
        self.verify = verify
        self.forked = FORKED if forked is None else forked
        self.scheme = "https" if "--tls-cert" in self.args else "http"
        self.proc: subprocess.Popen[bytes] | Forked | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def api(self) -> str:
        return f"{self.url}/api/v1"

    def token(self) -> str:
        return (self.data_dir / "admin-token").read_text().strip()

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.api, headers={"Authorization": f"Bearer {self.token()}"},
                            verify=self._verify(), timeout=30, **kwargs)  # type: ignore[arg-type]

    def _verify(self) -> ssl.SSLContext | bool:
        return default_ssl_context() if self.verify is True else self.verify

    def start(self) -> UpProcess:
        """Start it and return once /health answers."""
        args = ["up", "--data-dir", str(self.data_dir), "--port", str(self.port), *self.args]
        env = {**os.environ, **(self.env or {})}
        proc: subprocess.Popen[bytes] | Forked
        if self.forked and usable(self.env or {}):
            proc = Zygote.shared().spawn(args, env, self.log_path)
        else:
            with open(self.log_path, "ab") as log:
                proc = subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", *args], stdout=log,
                                        stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        self.proc = proc

        with httpx.Client(verify=self._verify(), timeout=5) as probe:  # one client for every poll
            def healthy() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"gpupool up exited with {proc.returncode}:\n{self.log_text()}")
                return probe.get(f"{self.api}/health").status_code == 200

            until(healthy, START_TIMEOUT_S, "gpupool up answering /health")
        return self

    def end_work(self, timeout_s: float = 60.0) -> None:
        """Cancel every workload not yet finished and wait until each is: a stopped server leaves
        its pods running (the next start adopts them), so a test that stops one with work running
        leaves the pods' processes behind for the rest of the run."""
        final = ("succeeded", "failed", "cancelled")

        def unfinished(api: httpx.Client) -> list[dict[str, Any]]:
            answer = api.get("/workloads", params={"limit": 500})
            answer.raise_for_status()
            return [w for w in answer.json()["items"] if w["status"] not in final]

        with self.client() as api:
            for workload in unfinished(api):
                api.post(f"/workloads/{workload['id']}/cancel")  # 409 once it finished meanwhile
            until(lambda: not unfinished(api), timeout_s, "every workload finished or cancelled")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not ended within 30 s. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def cli(args: Sequence[str], env: dict[str, str], timeout_s: float = 60.0
        ) -> subprocess.CompletedProcess[str]:
    """Run the `gpupool` CLI with exactly `env` added to a clean copy of this environment."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("GPUPOOL_") and k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    return run_cli(args, {**base, **env}, timeout_s=timeout_s)
