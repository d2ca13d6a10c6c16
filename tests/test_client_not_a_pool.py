"""An address that is no gpupool server's (the dashboard's /ui page copied from the browser, another
service's port) is told as that, in one sentence, by every kind of call: JSON, typed answers, event
streams and image uploads; never a decoding traceback."""

from __future__ import annotations

import io

import httpx
import pytest

from gpupool.client import Client
from gpupool.errors import InvalidInput

PAGE = "<!doctype html><title>gpupool</title><div id=app></div>"


def _page(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, text=PAGE, headers={"content-type": "text/html; charset=utf-8"})


def _wrong_json(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={})


@pytest.mark.parametrize("call", [
    lambda pool: pool.request("GET", "/pool"),
    lambda pool: pool.workloads(),
    lambda pool: pool.workload("w-1"),
    lambda pool: pool.nodes(),
    lambda pool: list(pool.stream_events()),
    lambda pool: pool.import_image(io.BytesIO(b"x" * 10), "img"),
], ids=["request", "list", "one", "many", "stream", "image"])
def test_a_web_page_where_the_pool_should_answer_is_said_to_be_no_pool(call: object) -> None:
    said = "answered HTTP 200 with text/html, not a gpupool answer"
    with Client("http://pool.test/ui", "gp_x", transport=httpx.MockTransport(_page)) as pool, \
            pytest.raises(InvalidInput, match=said) as caught:
        call(pool)  # type: ignore[operator]
    assert "GPUPOOL_URL is http://HOST:PORT, without the dashboard's /ui" in caught.value.message


def test_json_of_another_shape_is_said_to_be_no_pools_answer() -> None:
    with Client("http://pool.test", "gp_x", transport=httpx.MockTransport(_wrong_json)) as pool:
        with pytest.raises(InvalidInput, match="answered with JSON that is not WorkloadOut as this client"):
            pool.workload("w-1")
        with pytest.raises(InvalidInput, match="not a list of NodeOut"):
            pool.nodes()
