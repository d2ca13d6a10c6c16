"""HAProxy supervised by the pool: started, restarted when it dies, changed only at runtime.

The process runs in master-worker mode with an empty environment (it needs none of the server's
settings or secrets). Where the pool runs as root, its workers (the processes that parse requests)
drop to an account of their own, `gpupool_haproxy` (created like the pods' accounts, with a group of
its own), chrooted into a jail holding only the two sockets they write to (the activator's and the
latency log's, writable by that group alone); the master stays the pool's, so the admin socket it
binds stays the pool's alone (mode 0600). Replicas are added (`add server`, then `enable health`
and `enable server`), drained (`set server ... state drain`) and deleted (`state maint`, `del
server`) through the runtime socket, and tokens follow the store through `add map`/`del map`: the
process is never reloaded for those. A new or deleted service (a new backend) reloads the master
(SIGUSR2): its pid stays and open connections finish on the old worker.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpupool.agent.identity import ensure_router_account
from gpupool.errors import ProviderError
from gpupool.server.dataplane.haproxy_config import (
    HAProxyPaths,
    Jail,
    backend_name,
    render,
    render_maps,
    server_options,
)
from gpupool.server.dataplane.haproxy_log import LatencyLog
from gpupool.server.dataplane.model import Backend, Route, ServiceTraffic

log = logging.getLogger("gpupool.dataplane")

RESTART_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class RuntimeError_(Exception):
    """The runtime API refused a command (the text is HAProxy's answer)."""


def stop_stale(directory: Path, timeout_s: float = 10.0) -> bool:
    """End the HAProxy a previous run of the pool left behind in `directory` (the pool was killed
    and could not stop it), so its listener is free again; True when there was one. Only a process
    whose command line names this directory's configuration is signalled."""
    paths = HAProxyPaths(directory)
    try:
        pid = int(paths.pidfile.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return False
    if str(paths.config).encode() not in cmdline:
        return False
    started = _started(pid)  # once it is gone its pid may soon be another process's
    for sig in (signal.SIGTERM, signal.SIGKILL):  # one that does not end on SIGTERM is killed
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + timeout_s / 2
        while _started(pid) == started and time.monotonic() < deadline:
            time.sleep(0.02)
        if _started(pid) != started:
            break
    else:
        log.error("the HAProxy (pid %d) a previous run of the pool left running did not end", pid)
        return True
    log.warning("stopped the HAProxy (pid %d) a previous run of the pool left running", pid)
    return True


def _started(pid: int) -> str | None:
    """When the process started (field 22 of /proc/PID/stat), or None once it is gone or a zombie
    (dead, its sockets closed, only its parent's wait() left): with the start time a pid that is
    already another process's does not count as the same one."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if len(fields) < 20 or fields[0] in ("Z", "X", "x") else fields[19]


def find_haproxy() -> str | None:
    """The haproxy binary, or None when it is not installed."""
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(p, os.X_OK)), None)


class RuntimeAPI:
    """HAProxy's stats socket in non-interactive mode: one command per connection, blocking."""

    def __init__(self, path: Path, timeout_s: float = 5.0) -> None:
        self.path = path
        self.timeout_s = timeout_s

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout_s)
            sock.connect(str(self.path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def must(self, line: str, ok: tuple[str, ...] = ("",)) -> str:
        """Run a command whose answer must start with one of `ok` (empty: no answer at all)."""
        answer = self.command(line).strip()
        if not any(answer.startswith(prefix) if prefix else answer == "" for prefix in ok):
            raise RuntimeError_(f"{line!r}: {answer}")
        return answer

    def stat_rows(self) -> list[dict[str, str]]:
        text = self.command("show stat").lstrip("# ")
        return list(csv.DictReader(io.StringIO(text)))


class HAProxySupervisor:
    """Runs HAProxy for the pool and keeps it in step with the services, replicas and tokens given.

    Every public method is blocking and safe to call from any thread; set_backends and set_tokens are
    idempotent (they apply the difference to what the router has).
    """

    def __init__(self, binary: str, directory: Path, host: str, port: int, cold_start_limit_s: float) -> None:
        self.binary = binary
        self.paths = HAProxyPaths(directory)
        self.host, self.port = host, port
        self.cold_start_limit_s = cold_start_limit_s
        self.runtime = RuntimeAPI(self.paths.runtime_socket)
        self._lock = threading.RLock()
        self._routes: dict[str, Route] = {}
        self._backends: dict[str, dict[str, Backend]] = {}
        self._tokens: dict[str, str] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self.restarts = 0
        self.latency = LatencyLog(self.paths.latency_log_socket,
                                  lambda backend: backend in self._backend_names)
        self._backend_names: frozenset[str] = frozenset()
        self.jail: Jail | None = None
        """The workers' account and root where the pool runs as root (None: they run as the pool)."""

    # -- the process --------------------------------------------------------------------------------
    @property
    def master_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        self.paths.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.paths.directory, 0o700)
        self.paths.jail.mkdir(mode=0o700, exist_ok=True)
        stop_stale(self.paths.directory)
        self.jail = _jail() if os.geteuid() == 0 else None
        self.latency.start()  # bound before HAProxy logs to it
        jail = self.jail
        if jail is not None:  # the workers may enter the jail and write to its two sockets, nothing more
            os.chown(self.paths.jail, 0, jail.gid)
            os.chmod(self.paths.jail, 0o710)
            for sock in (self.paths.latency_log_socket, self.paths.activator_socket):
                if sock.exists():
                    os.chown(sock, 0, jail.gid)
                    os.chmod(sock, 0o620)
        with self._lock:
            self._write_files()
            self._spawn()
        self._watcher = threading.Thread(target=self._watch, name="haproxy-supervisor", daemon=True)
        self._watcher.start()

    def _spawn(self) -> None:
        self.paths.runtime_socket.unlink(missing_ok=True)
        fd = os.open(self.paths.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self._proc = subprocess.Popen(
                [self.binary, "-W", "-db", "-f", str(self.paths.config)],
                stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, start_new_session=True, close_fds=True)
        finally:
            os.close(fd)
        _write_private(self.paths.pidfile, f"{self._proc.pid}\n")
        self._wait_for_socket()

    def _wait_for_socket(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        assert self._proc is not None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self.paths.log.read_text(errors="replace").strip()[-500:]
                raise OSError(f"haproxy exited at start ({self._proc.returncode}): {err}")
            try:
                self.runtime.command("show info")
                return
            except OSError:
                self._stopping.wait(0.02)
        raise OSError(f"haproxy did not open its runtime socket within {timeout_s:g} s")

    def _watch(self) -> None:
        attempt = 0
        while not self._stopping.is_set():
            proc = self._proc
            if proc is None:
                return
            proc.wait()
            if self._stopping.is_set():
                return
            pause = RESTART_BACKOFF_S[min(attempt, len(RESTART_BACKOFF_S) - 1)]
            log.warning("haproxy exited with %s; restarting it in %.1f s", proc.returncode, pause)
            if self._stopping.wait(pause):
                return
            with self._lock:
                try:
                    self._write_files()
                    self._spawn()
                    self.restarts += 1
                    attempt = 0
                except OSError as exc:
                    log.error("haproxy did not restart: %s", exc)
                    attempt += 1

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=10)
        self.latency.stop()

    def _write_files(self) -> None:
        backends = {name: list(by_id.values()) for name, by_id in self._backends.items()}
        files = render_maps(list(self._routes.values()), self._tokens)
        for attr, text in files.items():
            _write_private(getattr(self.paths, attr), text)
        text = render(self.paths, self.host, self.port, list(self._routes.values()), backends,
                      self.cold_start_limit_s, self.jail)
        _write_private(self.paths.config, text)

    def _reload(self) -> None:
        """Re-read the configuration (new backends): the master stays, a new worker takes over."""
        assert self._proc is not None
        before = self.runtime.command("show info")
        self._wait_until_master_catches_sigusr2()
        os.kill(self._proc.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the new worker answers with another pid
            try:
                if _pid_line(self.runtime.command("show info")) not in (None, _pid_line(before)):
                    return
            except OSError:
                pass
            self._stopping.wait(0.02)
        raise OSError("haproxy did not reload within 10 s")

    def _wait_until_master_catches_sigusr2(self, timeout_s: float = 10.0) -> None:
        """The master installs its reload handler only after its first worker is up; before that
        SIGUSR2 would end it. /proc says when the handler is in place."""
        assert self._proc is not None
        status = Path(f"/proc/{self._proc.pid}/status")
        bit = 1 << (signal.SIGUSR2 - 1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            caught = next((line.split()[1] for line in status.read_text().splitlines()
                           if line.startswith("SigCgt:")), "0")
            if int(caught, 16) & bit:
                return
            self._stopping.wait(0.01)
        raise OSError("haproxy's master did not become ready to reload")

    # -- what it routes -----------------------------------------------------------------------------
    def set_routes(self, routes: Sequence[Route]) -> None:
        """The services routed; a service added or removed reloads, a changed owner or publicity does not."""
        wanted = {r.service: r for r in routes}
        with self._lock:
            structural = set(wanted) != set(self._routes) or any(
                (wanted[s].probe, wanted[s].cold_start_limit_s)
                != (self._routes[s].probe, self._routes[s].cold_start_limit_s) for s in wanted)
            old, old_names, old_backends = self._routes, self._backend_names, dict(self._backends)
            self._routes = wanted
            self._backend_names = frozenset(backend_name(s) for s in wanted)
            for gone in set(self._backends) - set(wanted):
                del self._backends[gone]
            try:
                self._write_files()
                if structural:
                    self._reload()
                    return
            except Exception:  # not applied: the next call tries again rather than taking it as done
                self._routes, self._backend_names, self._backends = old, old_names, old_backends
                raise
            for name, route in wanted.items():
                if old[name].tenant != route.tenant:
                    self.runtime.must(f"set map {self.paths.services_map} {name} {route.tenant}")
                if old[name].public and not route.public:
                    self.runtime.must(f"del map {self.paths.public_map} {name}")
                elif route.public and not old[name].public:
                    self.runtime.must(f"add map {self.paths.public_map} {name} yes")

    def set_backends(self, service: str, backends: Sequence[Backend]) -> None:
        """The ready replicas of one service: new ones are added, missing ones drained and deleted."""
        with self._lock:
            route = self._routes[service]
            have = self._backends.setdefault(service, {})
            wanted = {b.server_name: b for b in backends}
            be = backend_name(service)
            for name, backend in sorted(wanted.items()):
                if have.get(name) == backend:
                    continue
                if name in have:
                    self._remove(be, name)
                self.runtime.must(f"add server {be}/{name} {backend.host}:{backend.port} "
                                  f"{server_options(route.probe)}", ok=("New server registered",))
                self.runtime.must(f"enable health {be}/{name}")
                self.runtime.must(f"enable server {be}/{name}")
                have[name] = backend
            for name in sorted(set(have) - set(wanted)):
                self._remove(be, name)
                del have[name]
            self._write_files()

    def _remove(self, be: str, name: str) -> None:
        """Drain (no new request), wait for the requests in flight, then delete."""
        self.runtime.must(f"set server {be}/{name} state drain")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self._current_sessions(be, name) > 0:
            self._stopping.wait(0.05)
        self.runtime.must(f"set server {be}/{name} state maint")
        self.runtime.must(f"shutdown sessions server {be}/{name}")
        self.runtime.must(f"del server {be}/{name}", ok=("Server deleted",))

    def _current_sessions(self, be: str, name: str) -> int:
        for row in self.runtime.stat_rows():
            if row.get("pxname") == be and row.get("svname") == name:
                return int(row.get("scur") or 0)
        return 0

    def set_tokens(self, tokens: Mapping[str, str]) -> None:
        """Token sha256 (hex) -> tenant: the router answers exactly these tokens from now on."""
        with self._lock:
            for digest in sorted(set(self._tokens) - set(tokens)):
                self.runtime.must(f"del map {self.paths.tokens_map} {digest}")
            for digest, tenant in sorted(tokens.items()):
                if self._tokens.get(digest) == tenant:
                    continue
                verb = "set" if digest in self._tokens else "add"
                self.runtime.must(f"{verb} map {self.paths.tokens_map} {digest} {tenant}")
            self._tokens = dict(tokens)
            self._write_files()

    def traffic(self) -> dict[str, ServiceTraffic]:
        """Per service: requests in flight (queued, at a replica or held by the activator) and the
        total answered, from `show stat`."""
        out: dict[str, ServiceTraffic] = {}
        names = {backend_name(s): s for s in self._routes}
        self.latency.forget(set(names))
        for row in self.runtime.stat_rows():
            service = names.get(row.get("pxname", ""))
            if service is None or row.get("svname") != "BACKEND":
                continue
            p50, p99 = self.latency.quantiles(row["pxname"])  # from its request log, per request
            out[service] = ServiceTraffic(
                service=service, in_flight=int(row.get("qcur") or 0) + int(row.get("scur") or 0),
                requests_total=int(row.get("stot") or 0), latency_p50_ms=p50, latency_p99_ms=p99,
                latency_avg_ms=float(row["ttime"]) if row.get("ttime") else None)
        return out


def _jail() -> Jail | None:
    """The workers' own account (created when missing); None, said in the log, where it cannot be."""
    try:
        account = ensure_router_account()
    except ProviderError as exc:
        log.warning("HAProxy's workers run as the pool's own account: %s", exc.message)
        return None
    return Jail(account.uid, account.gid)


def _pid_line(info: str) -> str | None:
    return next((line for line in info.splitlines() if line.startswith("Pid:")), None)


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
