"""Start and stop the Ray processes gpupool owns: a head beside the server, a worker node per machine.

Each is one `ray start --block` in a process group of its own, so stopping it (SIGTERM, a grace,
then SIGKILL of the group) takes every Ray process it started and nothing else; `ray stop` would
kill every Ray process of the machine. Each gets a short temp dir, /tmp/gpr-<pid>-<n>/ray, whose
parent only the pool's account may enter (Ray's Unix sockets live there, and a socket path may not
exceed 107 bytes); directories left by processes that no longer exist are removed at the next start.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from gpupool.errors import ProviderError
from gpupool.providers.ray.settings import ray_env

TEMP_ROOT = Path("/tmp")
TEMP_PREFIX = "gpr-"
_TEMP_NAME = re.compile(r"^gpr-(\d+)-\d+$")
_counter = iter(range(1, 1 << 30))
_counter_lock = threading.Lock()
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0
"""How long Ray's processes get to exit after SIGTERM before the group is killed."""
OBJECT_STORE_BYTES_SIMULATED = 100 * 2**20
"""A simulated node's object store: pods never use it, and a default one reserves 30% of RAM each."""


BIND_FAILED = ("Address already in use", "Failed to add any wildcard listeners")
"""What Ray's processes log when their port is taken (Python's OSError; gRPC's, for the GCS)."""
PORTS_OF = ("gcs_server", "raylet", "dashboard_agent", "runtime_env_agent", "ray_client_server")
"""The logs of the processes that bind the ports free_ports chose. (Not the monitor's: it tries a
fixed metrics port, taken whenever another head runs on the machine, and runs on without it.)"""
START_TRIES = 3
"""How many times a node starts, with fresh ports each time, when one it was given was taken."""


class PortTaken(ProviderError):
    """A port chosen for a Ray node was taken by another process before the node bound it."""


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports: every socket stays bound until all are chosen, so the kernel
    cannot hand the same port out twice (Ray refuses a node whose components share one)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _used_by_a_process(paths: list[Path]) -> set[Path]:
    """Which of `paths` a running process names on its command line (a Ray process outliving the
    process that started it still uses its temp dir)."""
    wanted = {str(p).encode(): p for p in paths}
    used: set[Path] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes()
            used.update(path for text, path in wanted.items() if text in cmdline)
    return used


def clean_stale_temp_dirs(root: Path = TEMP_ROOT) -> list[Path]:
    """Remove the temp dirs of gpupool Ray processes whose starting process is gone and that no
    running process uses."""
    stale = [path for path in root.glob(TEMP_PREFIX + "*") if (match := _TEMP_NAME.match(path.name))
             and path.is_dir() and not _pid_alive(int(match.group(1)))]
    in_use = _used_by_a_process(stale) if stale else set()
    removed = [path for path in stale if path not in in_use]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def short_temp_dir(root: Path = TEMP_ROOT) -> Path:
    """A new temp dir for one Ray process: `ray` inside a directory only its owner may enter, named
    by this process's pid (for the clean-up). Ray makes its temp dir and the session's
    directories in it (sockets, logs) writable by everyone, without the sticky bit, so that many
    users can share one: on a node where pods run as tenants' accounts, any pod could then delete or
    replace the raylet's sockets, or plant names among the logs Ray's processes (the server's
    account) open. The private parent keeps every other account out of all of it."""
    clean_stale_temp_dirs(root)
    with _counter_lock:
        n = next(_counter)
    private = root / f"{TEMP_PREFIX}{os.getpid()}-{n}"
    shutil.rmtree(private, ignore_errors=True)
    private.mkdir(mode=0o700, parents=True)
    os.chmod(private, 0o700)  # whatever the umask
    path = private / "ray"
    path.mkdir(mode=0o700)
    return path


def remove_temp_dir(path: Path) -> None:
    """Remove a temp dir `short_temp_dir` made, with its private parent."""
    shutil.rmtree(path, ignore_errors=True)
    if _TEMP_NAME.match(path.parent.name):
        shutil.rmtree(path.parent, ignore_errors=True)


_WATCHED_CLI = """\
import os, signal, threading, time
def _watch(parent):
    while os.getppid() == parent:
        time.sleep(1)
    os.kill(os.getpid(), signal.SIGTERM)  # ray start --block stops every process it started
threading.Thread(target=_watch, args=({parent},), daemon=True).start()
from ray.scripts.scripts import main
main()
"""


def _ray_cli() -> list[str]:
    """Ray's command line, in a process that stops (and stops its node) once the process that
    started it is gone: a server killed with -9 leaves no Ray cluster behind."""
    return [sys.executable, "-c", _WATCHED_CLI.format(parent=os.getpid())]


class RayProcess:
    """One `ray start --block`: a head or a worker node. stop() is idempotent."""

    def __init__(self, argv: list[str], env: Mapping[str, str], temp_dir: Path, *, head: bool) -> None:
        self.temp_dir = temp_dir
        self.head = head
        self.log_path = temp_dir / "ray-start.log"
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True, cwd="/")
        self.address = ""

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no output"
        return lines[-1] if lines else "no output"

    def port_taken(self) -> str:
        """Which of the node's logs said a process could not bind its port ('' if none did): another
        process took it after free_ports chose it, and Ray then waits up to 40 s for the component."""
        for path in sorted(self.temp_dir.glob("session_*/logs/*")):
            with contextlib.suppress(OSError):
                if path.name.startswith(PORTS_OF) and path.is_file() and path.stat().st_size < 1 << 20:
                    text = path.read_text(errors="replace")
                    if said := next((words for words in BIND_FAILED if words in text), ""):
                        return f"{path.name}: {said}"
        return ""

    def wait_started(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Block until Ray says the node runs; ProviderError (with Ray's last line) if it exits, or
        PortTaken (within a second) if a port it was given was taken."""
        deadline = time.monotonic() + timeout_s
        checked = time.monotonic()
        while time.monotonic() < deadline:
            alive = self.alive()
            if not alive or time.monotonic() - checked >= 0.5:
                checked = time.monotonic()
                if taken := self.port_taken():
                    self.stop(grace_s=0)
                    raise PortTaken(f"Ray did not start: another process took a port it was given ({taken}).")
            if not alive:
                raise ProviderError(f"Ray did not start ({self._log_tail()}); see {self.log_path}.")
            with contextlib.suppress(OSError):
                if "Ray runtime started" in self.log_path.read_text(errors="replace"):
                    if self.head:
                        self.address = (self.temp_dir / "ray_current_cluster").read_text().strip()
                    return
            time.sleep(0.1)
        self.stop(grace_s=0)
        raise ProviderError(f"Ray did not start within {timeout_s:.0f} s; see {self.log_path}.")

    def kill(self) -> None:
        """SIGKILL the whole node at once, as a crash would (tests and `node leave --force`)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the node's process group, SIGKILL it after `grace_s`, remove its temp dir."""
        if self._proc.returncode is None or _group_alive(self._proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while _group_alive(self._proc.pid) and time.monotonic() < deadline:
                self._proc.poll()
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
        remove_temp_dir(self.temp_dir)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _common_args(temp_dir: Path, node_ip: str | None, num_cpus: int, ports: Mapping[str, int]) -> list[str]:
    ip = [f"--node-ip-address={node_ip}"] if node_ip else []  # Ray turns a loopback one into this host's
    return [*ip, f"--temp-dir={temp_dir}", f"--num-cpus={num_cpus}",
            "--num-gpus=0", "--disable-usage-stats", "--min-worker-port=0", "--max-worker-port=0",
            *_agent_ports(ports), "--include-log-monitor=false", "--block"]


AGENT_PORTS = ("dashboard_agent_listen_port", "metrics_agent_port", "metrics_export_port",
               "runtime_env_agent_port")


def agent_ports(extra: int = 0) -> tuple[dict[str, int], list[int]]:
    """A distinct free port for each of the node's Ray agents, so nodes on one machine never share
    Ray's defaults, and `extra` more, distinct from them, for the caller. (The raylet still registers
    only once its dashboard agent, a Python process with heavy imports, reports up: at most 15 s,
    Ray's own limit, which a machine loaded enough misses.)"""
    ports = free_ports(len(AGENT_PORTS) + extra)
    return dict(zip(AGENT_PORTS, ports, strict=False)), ports[len(AGENT_PORTS):]


def _agent_ports(ports: Mapping[str, int]) -> list[str]:
    return [f"--dashboard-agent-listen-port={ports['dashboard_agent_listen_port']}",
            f"--dashboard-agent-grpc-port={ports['metrics_agent_port']}",
            f"--metrics-export-port={ports['metrics_export_port']}",
            f"--runtime-env-agent-port={ports['runtime_env_agent_port']}"]


def start_head(token_path: Path, *, node_ip: str | None = None, port: int = 0,
               extra_env: Mapping[str, str] | None = None, wait: bool = True) -> RayProcess:
    """A Ray head (GCS) for the pool, with token auth; it runs no pods (no gpupool label)."""
    def head() -> RayProcess:
        temp_dir = short_temp_dir()
        ports, (gcs, client, dashboard) = agent_ports(extra=3)
        argv = [*_ray_cli(), "start", "--head", f"--port={port or gcs}",
                f"--ray-client-server-port={client}", f"--dashboard-port={dashboard}",
                "--include-dashboard=false", *_common_args(temp_dir, node_ip, 0, ports)]
        env = {**os.environ, **ray_env(token_path), **(extra_env or {})}
        return RayProcess(argv, env, temp_dir, head=True)
    return _started(head, wait)


def _started(start: Callable[[], RayProcess], wait: bool) -> RayProcess:
    """`start()`'s node, once it runs (with `wait`); a node whose port was taken between free_ports
    and its bind (an outbound connection's source port, another program) starts again, fresh ports."""
    for attempt in range(1, START_TRIES + 1):
        node = start()
        if not wait:
            return node
        try:
            node.wait_started()
        except PortTaken:
            if attempt == START_TRIES:
                raise
            continue
        return node
    raise AssertionError("unreachable")


def start_worker(address: str, token_path: Path, *, resources: Mapping[str, float],
                 labels: Mapping[str, str], node_ip: str | None = None, num_cpus: int | None = None,
                 object_store_bytes: int | None = None, extra_env: Mapping[str, str] | None = None,
                 wait: bool = True) -> RayProcess:
    """A Ray worker node joined to `address` that advertises no Ray GPUs, the given custom
    resources (gpupool's slices) and labels (the gpupool node name). Started by worker_node.py,
    which does what `ray start --block` does without loading Ray's command line."""
    ip = node_ip or _route_ip(address)

    def worker() -> RayProcess:
        temp_dir = short_temp_dir()
        ports, _ = agent_ports()
        argv = [sys.executable, "-m", "gpupool.providers.ray.worker_node", f"--address={address}",
                f"--temp-dir={temp_dir}", f"--resources={json.dumps(dict(resources))}",
                f"--labels={json.dumps(dict(labels))}", f"--node-ip-address={ip}",
                f"--num-cpus={num_cpus if num_cpus is not None else os.cpu_count() or 1}",
                f"--ports={json.dumps(ports)}", f"--parent-pid={os.getpid()}"]
        if object_store_bytes:
            argv.append(f"--object-store-memory={object_store_bytes}")
        return RayProcess(argv, {**os.environ, **ray_env(token_path), **(extra_env or {})}, temp_dir,
                          head=False)
    return _started(worker, wait)


def _route_ip(address: str) -> str:
    """This machine's address on the route to the head (what the other nodes reach it by)."""
    host, _, port = address.rpartition(":")
    with contextlib.suppress(OSError, ValueError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, int(port)))
        return str(sock.getsockname()[0])
    return "127.0.0.1"
