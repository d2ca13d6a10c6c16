"""Client.stream_events: server-sent events parsed into EventOut, and a dropped connection resumed
from the last id received (Last-Event-ID), so the caller gets every event once."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from gpupool.client import Client
from gpupool.errors import Unavailable


def _block(event_id: int, status: str) -> bytes:
    event = {"id": event_id, "workload_id": "w-1", "pod_id": "", "from_status": "", "to_status": status,
             "reason": "submitted", "reason_text": "", "message": "", "at_s": 1.0}
    return f"id: {event_id}\nevent: {status}\ndata: {json.dumps(event)}\n\n".encode()


def test_a_dropped_stream_resumes_after_the_last_event_without_a_gap_or_a_repeat() -> None:
    asked: list[str | None] = []

    def cut_after_two() -> Iterator[bytes]:
        yield b": start\nid: 0\n\n" + _block(1, "pending") + _block(2, "admitted")
        raise httpx.ReadError("connection reset")

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.headers.get("Last-Event-ID"))
        assert request.url.params["follow"] == "true" and request.url.params.get_list("workload") == ["w-1"]
        if len(asked) == 1:
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=cut_after_two())
        if len(asked) == 2:  # ends cleanly, as at a server's shutdown: a follower reconnects
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  content=b": keep-alive\n\n" + _block(3, "running"))
        raise httpx.ConnectError("refused")  # the server is gone for longer than the budget

    got: list[tuple[int, str]] = []
    with Client("http://pool.test", "gp_x", transport=httpx.MockTransport(handler)) as pool, \
            pytest.raises(Unavailable):
        for event in pool.stream_events(workload_ids=["w-1"], reconnect_s=0.3):
            got.append((event.id, event.to_status))
    assert got == [(1, "pending"), (2, "admitted"), (3, "running")]
    assert asked[:3] == [None, "2", "3"]  # new events first; then resumed after 2, then after 3


def test_a_finite_stream_ends_with_the_events_stored() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params["follow"] == "false" and request.headers.get("Last-Event-ID") == "5"
        return httpx.Response(200, content=b": start\nid: 5\n\n" + _block(6, "succeeded"))

    with Client("http://pool.test", "gp_x", transport=httpx.MockTransport(handler)) as pool:
        assert [e.id for e in pool.stream_events(after=5, follow=False)] == [6]


def test_an_unreachable_server_is_unavailable_after_the_reconnect_budget() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with Client("http://pool.test", "gp_x", transport=httpx.MockTransport(handler)) as pool, \
            pytest.raises(Unavailable):
        list(pool.stream_events(reconnect_s=0))
