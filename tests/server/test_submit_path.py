"""The submission hot path: group commit of concurrent submissions, and the plain-ASGI fast path's
answers matching the FastAPI route's (success, every refusal, and the usual error shape)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from conftest import Server
from gpupool.server.services.submit_writer import SubmitWriter

SPEC = {"command": ["true"], "resources": {"gpus": 0.25}}


def test_concurrent_submissions_share_transactions_and_each_gets_its_event(server: Server) -> None:
    writer: SubmitWriter = server.client.app.state.submit_writer  # type: ignore[attr-defined]
    batches_before = writer.batches
    app = server.client.app

    async def burst() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test",
                                     headers=server.headers()) as client:
            return await asyncio.gather(*(client.post("/api/v1/workloads", json=SPEC) for _ in range(40)))

    answers = asyncio.run(burst())
    assert [a.status_code for a in answers] == [201] * 40
    ids = [a.json()["id"] for a in answers]
    assert len(set(ids)) == 40 and all(a.json()["status"] == "pending" for a in answers)
    assert writer.batches - batches_before < 40  # grouped: fewer commits than submissions
    for workload_id in ids[:5]:
        events = server.client.get(f"/api/v1/workloads/{workload_id}/events", headers=server.headers())
        assert events.json()[0]["reason"] == "submitted"


def _post(server: Server, body: Any, headers: dict[str, str] | None = None,
          raw: bytes | None = None) -> httpx.Response:
    if raw is not None:
        json_headers = {**(headers or server.headers()), "content-type": "application/json"}
        return server.client.post("/api/v1/workloads", content=raw, headers=json_headers)
    return server.client.post("/api/v1/workloads", json=body, headers=headers or server.headers())


def test_refusals_keep_the_api_error_shape(server: Server) -> None:
    server.client.post("/api/v1/tenants", json={"name": "team-a"}, headers=server.headers())
    made = server.client.post("/api/v1/queues", json={"tenant": "team-a", "name": "small", "quota_gpus": 1},
                              headers=server.headers())
    assert made.status_code == 201
    cases = [
        (_post(server, SPEC, headers={"Authorization": "Bearer wrong"}), 401, "unauthorized"),
        (_post(server, {"command": []}), 422, "invalid_input"),
        (_post(server, {**SPEC, "bogus": 1}), 422, "invalid_input"),
        (_post(server, None, raw=b"{not json"), 422, "invalid_input"),
        (_post(server, {**SPEC, "queue": "nope"}), 404, "not_found"),
        (_post(server, {**SPEC, "tenant": "team-a", "queue": "small", "resources": {"gpus": 2}}), 409,
         "quota_exceeded"),
    ]
    for answer, status, code in cases:
        body = answer.json()
        assert (answer.status_code, body["code"]) == (status, code), body
        assert set(body) == {"code", "message", "details"} and body["message"]


def test_fast_path_answers_like_the_route(server: Server) -> None:
    answer = _post(server, {**SPEC, "name": "x"})
    assert answer.status_code == 201 and set(answer.json()) == {"id", "status"}
    shown = server.client.get(f"/api/v1/workloads/{answer.json()['id']}", headers=server.headers()).json()
    assert shown["name"] == "x" and shown["spec"]["resources"]["gpus"] == 0.25
    form = server.client.post("/api/v1/workloads", content=b"command=true", headers={
        **server.headers(), "content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 422  # not JSON: handed to the route, which refuses it as usual
