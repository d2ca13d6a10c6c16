"""A throwaway PostgreSQL whose chosen port another process takes before it binds still starts."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from gpupool.errors import Unavailable
from gpupool.server import pgtemp
from ports import free_port

pytestmark = pytest.mark.skipif(bool(pgtemp.why_unavailable()),
                                reason=f"PostgreSQL tests skipped: {pgtemp.why_unavailable()}")


def taken_ports(count: int, stack: ExitStack) -> list[int]:
    """`count` ports, each held by a listening socket (as another process would) until `stack` ends."""
    ports = []
    for _ in range(count):
        port = free_port()
        stack.enter_context(socket.create_server(("127.0.0.1", port)))
        ports.append(port)
    return ports


def chosen(first: list[int]) -> Iterator[int]:
    yield from first
    while True:
        yield free_port()


def test_a_port_taken_between_its_choice_and_the_bind_gives_way_to_another() -> None:
    with ExitStack() as stack:
        held = taken_ports(2, stack)
        ports = chosen(held)
        server = pgtemp.start(free_port=lambda: next(ports))
        try:
            assert server.port not in held
            import psycopg

            with psycopg.connect(f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres") as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
        finally:
            server.stop()


def test_every_port_taken_says_so() -> None:
    with ExitStack() as stack:
        held = taken_ports(pgtemp.START_TRIES, stack)
        ports = chosen(held)
        with pytest.raises(Unavailable) as refused:
            pgtemp.start(free_port=lambda: next(ports))
    assert str(refused.value) == (
        f"PostgreSQL could not start: each of the loopback ports {held} was taken by another process "
        "before it bound it; free some ports and try again")
