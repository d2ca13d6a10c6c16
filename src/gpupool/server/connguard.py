"""Connections bounded before any request is read (the API's and the in-process router's uvicorn).

uvicorn holds a connection that never finishes its request's headers for as long as the client
keeps it open: no timeout applies before the first request, and `limit_concurrency` answers 503
only once headers arrive. So a client opening connections and sending a few bytes on each (a
"slowloris") held one file descriptor of the server per connection, without a token, until the
server could accept no one's (bench/slow_clients.py). Here each client address (IPv6: its /64)
holds at most MAX_PER_ADDRESS connections at once (one more is closed as it is made), and each
request's headers must be complete within HEADER_TIMEOUT_S of its connection or of its first byte.
HAProxy in front does the same with `timeout http-request`.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpupool.server.ratelimit import address_key, count_down

MAX_PER_ADDRESS = 1024
"""Connections one client address may hold at once."""
HEADER_TIMEOUT_S = 10.0
"""How long a request's line and headers may take to arrive."""


def guarded_protocol(max_per_address: int = MAX_PER_ADDRESS,
                     header_timeout_s: float = HEADER_TIMEOUT_S) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with these bounds (`uvicorn.Config(http=...)`); the counts are
    this server's (one event loop)."""
    held: dict[str, int] = {}

    class Guarded(HttpToolsProtocol):
        _key: str | None = None
        _timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if self.client:  # (a unix socket's peer, HAProxy in front of the router, is not counted)
                key = address_key(str(self.client[0]))
                if held.get(key, 0) >= max_per_address:
                    transport.close()  # before any byte is read: no answer owed
                    return
                held[key] = held.get(key, 0) + 1
                self._key = key
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._timer is None:  # a request on a kept-alive connection
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def handle_websocket_upgrade(self) -> None:
            self._release()  # the websocket's protocol takes the connection from here
            super().handle_websocket_upgrade()

        def connection_lost(self, exc: Exception | None) -> None:
            self._release()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._timer = self.loop.call_later(header_timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _too_slow(self) -> None:
            self._timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def _release(self) -> None:
            self._disarm()
            if self._key is not None:
                count_down(held, self._key)
                self._key = None

    Guarded.held = held  # type: ignore[attr-defined]  # for tests
    return Guarded
