"""Probes against hostile or broken replicas: each returns by its deadline with a sentence, whatever
the replica does (answers one byte at a time, never answers, speaks something else, is not there)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from gpupool.api.services import ProbeSpec
from gpupool.server.serving.probes import Prober, probe_once
from ports import free_port

Behaviour = Callable[[socket.socket], None]


def trickle(conn: socket.socket) -> None:
    """Never ends its status line: one byte every 50 ms, forever (until the probe hangs up)."""
    try:
        while True:
            conn.sendall(b"H")
            time.sleep(0.05)
    except OSError:
        pass


def silent(conn: socket.socket) -> None:
    conn.recv(1024)
    threading.Event().wait(10)


def garbage(conn: socket.socket) -> None:
    conn.recv(1024)
    conn.sendall(b"SSH-2.0-OpenSSH\r\n")


def ok(conn: socket.socket) -> None:
    conn.recv(1024)
    conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")


@pytest.fixture
def replica() -> Iterator[Callable[[Behaviour], int]]:
    servers: list[socket.socket] = []

    def start(behaviour: Behaviour) -> int:
        server = socket.create_server(("127.0.0.1", 0))
        servers.append(server)

        def accept() -> None:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                threading.Thread(target=behaviour, args=(conn,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        return int(server.getsockname()[1])

    yield start
    for server in servers:
        server.close()


HTTP = ProbeSpec.model_validate({"path": "/healthz", "period_s": 1, "timeout_s": 0.3})
PATIENT = ProbeSpec.model_validate({"path": "/healthz", "period_s": 30, "timeout_s": 30})
"""For a replica that answers: its answer decides, not whether a loaded machine ran its thread
within 0.3 s (it returns as soon as the replica answers)."""


def test_a_replica_answering_one_byte_at_a_time_cannot_hold_the_probe(
        replica: Callable[[Behaviour], int]) -> None:
    port = replica(trickle)
    started = time.monotonic()
    error = probe_once(HTTP, "127.0.0.1", port)
    assert error == f"GET /healthz on 127.0.0.1:{port} timed out after 0.3 s"
    assert time.monotonic() - started < 5  # bounded by its deadline, not by the replica (which never stops)


@pytest.mark.parametrize(("behaviour", "spec", "words"), [
    (silent, HTTP, "timed out after 0.3 s"),
    (garbage, PATIENT, "did not answer HTTP (it sent b'SSH-2.0-OpenSSH')"),
    (ok, PATIENT, ""),
])
def test_each_answer_gets_its_sentence(replica: Callable[[Behaviour], int], behaviour: Behaviour,
                                       spec: ProbeSpec, words: str) -> None:
    error = probe_once(spec, "127.0.0.1", replica(behaviour))
    assert (words in error) if words else error == ""


def test_nothing_listening_says_so() -> None:
    port = free_port()  # nothing listens on it, and no other test or outbound connection takes it
    refused = "failed: Connection refused"
    assert probe_once(HTTP, "127.0.0.1", port) == f"GET /healthz on 127.0.0.1:{port} {refused}"
    tcp = ProbeSpec.model_validate({"kind": "tcp", "timeout_s": 0.3})
    assert probe_once(tcp, "127.0.0.1", port) == f"TCP connect to 127.0.0.1:{port} failed: Connection refused"


def test_a_tenant_whose_replicas_hang_every_probe_delays_only_its_own(
        replica: Callable[[Behaviour], int]) -> None:
    """Two workers: the hostile tenant's eight probes may hold one of them (each to its 30 s deadline),
    never both, so the other tenant's probe is answered while the first hostile one still hangs.
    (With 1 s deadlines, a worker the machine held up for a second let a second hostile probe end
    first: the count depended on this machine's speed, here only the order of events does.)"""
    prober = Prober(2)
    released = threading.Event()

    def hung(conn: socket.socket) -> None:
        conn.recv(1024)
        released.wait(60)

    try:
        slow = ProbeSpec.model_validate({"path": "/", "period_s": 30, "timeout_s": 30})
        hang = replica(hung)
        for i in range(8):
            assert prober.start(f"w-hostile-{i}", "readiness", slow, "127.0.0.1", hang, tenant="mallory")
        assert not prober.start("w-hostile-0", "readiness", slow, "127.0.0.1", hang, tenant="mallory")
        assert prober.start("w-good", "readiness", HTTP, "127.0.0.1", replica(ok), tenant="bob")
        seen: list[str] = []
        deadline = time.monotonic() + 20  # before the first hostile probe's deadline
        while "w-good" not in seen:
            assert time.monotonic() < deadline, seen
            seen += [r.workload_id for r in prober.results()]
            time.sleep(0.01)
        assert seen == ["w-good"], seen  # while the hostile probe that runs still hangs
    finally:
        prober.close()
        released.set()


def test_the_workers_start_with_the_first_probe_and_end_when_closed(
        replica: Callable[[Behaviour], int]) -> None:
    """Every server app builds a prober; one that never probes (its loops not started, or no service)
    holds no thread, so building an app leaves none behind."""
    prober = Prober(3)
    try:
        assert prober.threads == 0
        assert prober.start("w-good", "readiness", HTTP, "127.0.0.1", replica(ok), tenant="bob")
        assert prober.threads == 3
        deadline = time.monotonic() + 20
        while not prober.results():
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        prober.close()
    deadline = time.monotonic() + 20
    while prober.threads:
        assert time.monotonic() < deadline, "the prober's threads outlived close()"
        time.sleep(0.01)
