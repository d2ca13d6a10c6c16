"""Ports for the servers a test names before they start (`gpupool up --port N`, PostgreSQL, HAProxy),
and the slices of the pool's own ranges (replicas' $PORT, gangs' MASTER_PORT) each worker's pools use.

Binding port 0, closing the socket and handing the number to a server started later races twice:
the kernel hands out its ephemeral range (32768-60999 by default) to every outbound connection's
source port as well, and the other pytest-xdist worker binds port 0 from the same range, so between
the close and the server's bind either may take the port. Here each worker draws from a slice of its
own BELOW the ephemeral range (so no outbound connection can take one) and above nothing the suite
names itself: the slices tile [BASE, LIMIT), below the pool's serving replicas' default ports
(serving.port_base, 22000); where the ephemeral range starts lower than that leaves room for, they
tile the ports above it instead. A candidate is handed out only if it binds on every IPv4 address now (a
server of another run on the machine, or one of this worker's still running, holds it: the next is
tried), and a worker walks its slice in order from a random point, so it never hands one port out
twice before it has handed out the whole slice.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

from gpupool.config import GangsConfig, ServingConfig

BASE = 12_000
LIMIT = 22_000
SLICE = 1_000
"""At most this many ports a worker (more than a test file's servers could ever hold at once)."""


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral ports (from which port 0 and outbound sockets draw), first and last."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32_768, 60_999


def worker_slice(worker: str = "", count: int = 0) -> range:
    """The ports of pytest-xdist worker `worker` ('gw3'; '' for a run without workers) of `count`:
    slot 0 is the run without workers, slot n + 1 worker gwn, each slot as wide as the workers fit,
    in [BASE, LIMIT) below the ephemeral range, or above it where that range starts too low."""
    slot = _slot(worker)
    slots = max(count, slot) + 1
    low, high = ephemeral_range()
    start, top = BASE, min(LIMIT, low)
    if (top - start) // slots < 16:
        start, top = high + 1, 65_536
    width = min(SLICE, (top - start) // slots)
    if width < 16:
        raise RuntimeError(f"{count} pytest workers do not fit the ports outside the ephemeral range "
                           f"({low}-{high}), 16 each at least; run fewer workers (-n)")
    return range(start + slot * width, start + (slot + 1) * width)


def _slot(worker: str) -> int:
    """Worker `worker`'s slot: 0 for a run without workers ('' or 'master'), n + 1 for gwn."""
    return int(worker[2:]) + 1 if worker.startswith("gw") and worker[2:].isdigit() else 0


def _this_worker() -> tuple[str, int]:
    """This process's pytest-xdist worker and the run's worker count ('', 0 without workers)."""
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0
    return os.environ.get("PYTEST_XDIST_WORKER", ""), int(count)


def _binds(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


class _Ports:
    def __init__(self, ports: range) -> None:
        self.ports = ports
        self.next = random.randrange(len(ports))
        self.lock = threading.Lock()

    def take(self) -> int:
        with self.lock:
            for _ in range(len(self.ports)):
                port = self.ports[self.next]
                self.next = (self.next + 1) % len(self.ports)
                if _binds(port):
                    return port
        raise RuntimeError(f"no port of {self.ports.start}-{self.ports.stop - 1} binds: every one is held")


_mine: _Ports | None = None
_mine_lock = threading.Lock()


def free_port() -> int:
    """A loopback port nothing holds now, that no other worker of this run and no outbound connection
    will take, and that this worker does not hand out again until it has handed out its whole slice."""
    global _mine
    with _mine_lock:
        if _mine is None:
            _mine = _Ports(worker_slice(*_this_worker()))
        ports = _mine
    return ports.take()


def free_ports(count: int) -> list[int]:
    """`count` distinct ports of free_port's kind."""
    return [free_port() for _ in range(count)]


def replica_slice(worker: str = "", count: int = 0) -> range:
    """The service replicas' ports ($PORT, serving.port_base/port_count) of the pools that pytest-xdist
    worker `worker` of `count` starts: slot n of the pool's default range, numbered as worker_slice's.
    Where pods run without network namespaces (GPUPOOL_POD_NETNS off, or auto where the agent cannot
    make them) a replica binds its port on the host itself, and two workers' pools, each choosing at
    random from the whole default range, could give two replicas one port: the second fails to bind."""
    default = ServingConfig()
    replicas = range(default.port_base, default.port_base + default.port_count)
    return _share(worker, count, replicas, "replicas'")


def gang_slice(worker: str = "", count: int = 0) -> range:
    """The gangs' MASTER_PORTs (gangs.port_base/port_count) of the pools that pytest-xdist worker
    `worker` of `count` starts: slot n of the pool's default gang range, numbered as worker_slice's.
    Where pods run without network namespaces a gang's rank 0 binds its port on the host itself, and
    two workers' pools, each starting its search at a point of the whole default range drawn from the
    workload's id, could give two gangs running at once one port: the second's rank 0 fails to bind."""
    return _share(worker, count, GangsConfig().ports(), "gangs'")


def _share(worker: str, count: int, default: range, whose: str) -> range:
    """Slot `worker` of `count` workers' equal shares of a pool's `default` range (`whose` ports)."""
    slot = _slot(worker)
    width = len(default) // (max(count, slot) + 1)
    if width < 16:
        raise RuntimeError(f"{count} pytest workers do not fit the {whose} {len(default)} ports, "
                           "16 each at least; run fewer workers (-n)")
    return range(default.start + slot * width, default.start + (slot + 1) * width)


def serving_ports() -> range:
    """This worker's replica_slice."""
    return replica_slice(*_this_worker())


def serving_config() -> str:
    """The pool configuration (YAML) that keeps a pool's replicas to serving_ports: every test file
    whose replicas bind $PORT starts its pools with it (tests/test_layout.py checks)."""
    return _range_config("serving", serving_ports())


def gang_ports() -> range:
    """This worker's gang_slice."""
    return gang_slice(*_this_worker())


def gang_config(ports: range | None = None) -> str:
    """The pool configuration (YAML) that keeps a pool's gangs to `ports` (a part of gang_ports, all of
    it by default): every test file whose gangs meet at their MASTER_PORT starts its pools with it
    (tests/test_layout.py checks)."""
    return _range_config("gangs", gang_ports() if ports is None else ports)


def _range_config(section: str, ports: range) -> str:
    return f"{section}: {{port_base: {ports.start}, port_count: {len(ports)}}}\n"
