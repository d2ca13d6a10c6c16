"""Several servers in GPUPOOL_URL: the client tries them in order where a connection cannot be made,
keeps the one that answered, and sends a request again that was answered 503 with Retry-After."""

from __future__ import annotations

import re

import httpx
import pytest

from gpupool.client import Client
from gpupool.clientconfig import resolve
from gpupool.errors import InvalidInput, Unavailable


class Servers:
    """A transport standing for three servers: `down` refuse connections; others answer."""

    def __init__(self, down: set[str], unavailable: int = 0, retry_after: str | None = "0.1") -> None:
        self.down = down
        self.unavailable = unavailable
        self.retry_after = retry_after
        self.calls: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.host}:{request.url.port}"
        self.calls.append(host)
        if host in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.unavailable:
            self.unavailable -= 1
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            return httpx.Response(503, headers=headers, json={
                "code": "store_unavailable", "message": "The pool's store cannot be used right now; "
                "retry later.", "details": {}})
        if request.method == "POST":
            return httpx.Response(201, json={"id": f"w-{host.replace(':', '-')}"})
        return httpx.Response(200, json={"ok": host})


URLS = "http://10.0.0.1:8765, http://10.0.0.2:8765,http://10.0.0.3:8765/api/v1/"


def test_fails_over_in_order_and_remembers_the_server_that_answered() -> None:
    servers = Servers(down={"10.0.0.1:8765", "10.0.0.2:8765"})
    with Client(URLS, "gp_t", transport=httpx.MockTransport(servers)) as pool:
        assert pool.urls == ["http://10.0.0.1:8765", "http://10.0.0.2:8765", "http://10.0.0.3:8765"]
        assert pool.submit(command=["true"]) == "w-10.0.0.3-8765"
        assert servers.calls == ["10.0.0.1:8765", "10.0.0.2:8765", "10.0.0.3:8765"]
        assert pool.request("GET", "/pool") == {"ok": "10.0.0.3:8765"}
        assert servers.calls[3:] == ["10.0.0.3:8765"]  # remembered: no second try of the dead ones
        servers.down = {"10.0.0.3:8765"}  # that one dies too: back to the first that answers
        assert pool.request("GET", "/pool") == {"ok": "10.0.0.1:8765"}


def test_all_down_names_every_server() -> None:
    servers = Servers(down={"10.0.0.1:8765", "10.0.0.2:8765", "10.0.0.3:8765"})
    with Client(URLS, "gp_t", transport=httpx.MockTransport(servers)) as pool, \
            pytest.raises(Unavailable, match=re.escape(
                "10.0.0.1:8765, http://10.0.0.2:8765, http://10.0.0.3:8765")):
        pool.request("GET", "/pool")


def test_a_503_with_retry_after_is_sent_again_until_it_succeeds() -> None:
    servers = Servers(down=set(), unavailable=2)
    with Client("http://10.0.0.1:8765", "gp_t", transport=httpx.MockTransport(servers)) as pool:
        assert pool.submit(command=["true"]) == "w-10.0.0.1-8765"
    assert len(servers.calls) == 3


def test_a_503_is_raised_past_the_retry_budget_or_without_retry_after() -> None:
    no_header = Servers(down=set(), unavailable=1, retry_after=None)
    with Client("http://10.0.0.1:8765", "gp_t", transport=httpx.MockTransport(no_header)) as pool, \
            pytest.raises(Unavailable, match="store"):
        pool.submit(command=["true"])
    endless = Servers(down=set(), unavailable=1000)
    with Client("http://10.0.0.1:8765", "gp_t", transport=httpx.MockTransport(endless),
                retry_unavailable_s=0.35) as pool, pytest.raises(Unavailable, match="store"):
        pool.submit(command=["true"])
    assert 2 <= len(endless.calls) <= 5


def test_a_bad_url_in_the_list_is_named() -> None:
    with pytest.raises(InvalidInput, match="ftp://x"):
        resolve("http://127.0.0.1:1,ftp://x", "gp_t")
