"""A federation member's fence (server/federation_fence.py), on both stores: once the hub has been
silent past the fence, the hub's copies (a hub's id in their environment) are stopped and held, and
nothing else is touched, not even work that only mentions the id's variable name elsewhere."""

from __future__ import annotations

import time
from pathlib import Path

from conftest import start_server, stop_server
from gpupool.server.auth import FEDERATION_ID_ENV
from gpupool.server.federation_fence import Fence


def test_the_fence_stops_and_holds_only_the_hubs_copies(tmp_path: Path, db_url: str) -> None:
    server = start_server(tmp_path, db_url)
    try:
        api, h = server.client, server.headers()
        assert api.post("/api/v1/tenants", json={"name": "team"}, headers=h).status_code == 201

        def submit(env: dict[str, str], command: list[str]) -> str:
            answer = api.post("/api/v1/workloads", headers=h, json={
                "command": command, "env": env, "resources": {"gpus": 1}, "tenant": "team"})
            assert answer.status_code == 201, answer.text
            return str(answer.json()["id"])

        copy = submit({FEDERATION_ID_ENV: "f-1"}, ["train"])
        own = submit({}, ["echo", FEDERATION_ID_ENV])  # the name in its command, not in its env
        server.wait_for(lambda: all(api.get(f"/api/v1/workloads/{w}", headers=h).json()["status"] == "running"
                                    for w in (copy, own)))
        fence = Fence(server.rt)
        fence.fence_s = 5.0
        server.rt.auth.federation_heard_s = time.monotonic() - 1.0
        assert fence.check() == 0  # heard from a second ago
        server.rt.auth.federation_heard_s = time.monotonic() - 10.0
        assert fence.check() == 1
        shown = api.get(f"/api/v1/workloads/{copy}", headers=h).json()
        assert (shown["status"], shown["held"], shown["reason"]) == ("pending", "user", "federation_fenced")
        assert api.get(f"/api/v1/workloads/{own}", headers=h).json()["status"] == "running"
    finally:
        stop_server(server)
