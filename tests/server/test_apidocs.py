"""/docs and /redoc load every asset from the pool itself; /openapi.json and /health answer at the root."""

from __future__ import annotations

import re

import pytest

from conftest import Server

_URL = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']"""  # <script src>, <link href>
                  r"""|url\s*:\s*["']([^"']+)["']"""  # Swagger UI's spec URL
                  r"""|spec-url=["']([^"']+)["']""")  # ReDoc's


def _referenced(html: str) -> list[str]:
    return sorted({next(group for group in match.groups() if group) for match in _URL.finditer(html)})


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_reference_only_same_origin_urls_that_answer(server: Server, page: str) -> None:
    answer = server.client.get(page)
    assert answer.status_code == 200 and "text/html" in answer.headers["content-type"]
    urls = _referenced(answer.text)
    assert any(url.endswith(".js") for url in urls), urls
    assert "/api/v1/openapi.json" in urls
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), f"{page} loads {url} from elsewhere"
        assert server.client.get(url).status_code == 200, url
    assert "https://" not in answer.text and "http://" not in answer.text


def test_openapi_and_health_answer_at_the_root_and_under_api_v1(server: Server) -> None:
    for path in ("/openapi.json", "/api/v1/openapi.json"):
        answer = server.client.get(path)
        assert answer.status_code == 200 and "/api/v1/workloads" in answer.json()["paths"]
    for path in ("/health", "/api/v1/health"):
        answer = server.client.get(path)
        assert answer.status_code == 200 and answer.json()["status"] == "ok"
    assert "/health" not in server.client.get("/openapi.json").json()["paths"]  # documented once
