"""Connections bounded before any request is read (server/connguard.py): a client address holds at
most so many at once, and a request's headers must arrive in time. Without it a client sending a
few bytes on each of many connections held a descriptor of the server per connection, forever."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

from gpupool.server.connguard import guarded_protocol
from live import serving
from ports import free_port


async def _app(scope: dict[str, object], receive: Any, send: Any) -> None:
    if scope["type"] == "websocket":  # accepted, then held until the client goes
        await receive()
        await send({"type": "websocket.accept"})
        while (await receive())["type"] != "websocket.disconnect":
            pass
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@contextmanager
def _served(max_per_address: int, header_timeout_s: float) -> Iterator[tuple[int, dict[str, int]]]:
    protocol = guarded_protocol(max_per_address=max_per_address, header_timeout_s=header_timeout_s)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off", http=protocol))
    with serving(server):
        yield port, protocol.held  # type: ignore[attr-defined]


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closed `sock` within `seconds` (end of file, or a reset: it closed with
    the bytes sent still unread)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _slow(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    return sock


def _until(condition: Callable[[], bool], what: object) -> None:
    deadline = time.monotonic() + 15
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_an_address_holds_so_many_connections() -> None:
    with _served(max_per_address=3, header_timeout_s=120) as (port, held):
        slow = [_slow(port) for _ in range(3)]
        _until(lambda: held.get("127.0.0.1") == 3, held)
        extra = _slow(port)
        assert _closed_within(extra, 10), "a fourth connection of the address was held"
        assert not any(_closed_within(s, 0.05) for s in slow)  # the three are still held
        for sock in (*slow, extra):
            sock.close()
        _until(lambda: not held, held)  # each closed connection gives its place back
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            assert [client.get("/").status_code for _ in range(5)] == [200] * 5  # kept alive: one connection
            assert held == {"127.0.0.1": 1}


def test_headers_that_do_not_arrive_in_time_are_cut_off() -> None:
    with _served(max_per_address=100, header_timeout_s=0.5) as (port, held):
        slow = [_slow(port) for _ in range(3)]
        assert all(_closed_within(s, 10) for s in slow), "headers that never ended were waited for"
        _until(lambda: not held, held)
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5)
        assert b"200 OK" in sock.recv(1000)
        time.sleep(1.0)  # past the header timeout, idle between requests: kept (uvicorn's keep-alive rules)
        assert held == {"127.0.0.1": 1}
        sock.sendall(b"GET / HTTP/1.1\r\n")  # the next request, never finished
        assert _closed_within(sock, 10)
        for s in (*slow, sock):
            s.close()


def test_a_websocket_gives_its_place_back_at_the_upgrade() -> None:
    """The websocket's protocol takes the connection over (exec's streams): it is not the HTTP
    protocol's to count any more, and its end would never reach it."""
    from websockets.sync.client import connect

    with _served(max_per_address=1, header_timeout_s=120) as (port, held):
        with connect(f"ws://127.0.0.1:{port}/") as first:
            _until(lambda: not held, held)
            with connect(f"ws://127.0.0.1:{port}/") as second:  # the address's one place is free
                assert first.protocol.state.name == second.protocol.state.name == "OPEN"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            assert client.get("/").status_code == 200
