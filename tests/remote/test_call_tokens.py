"""A pod's call token takes only its own workload's calls, only while its pod runs, on one route only;
another tenant can neither read a call nor answer it."""

from __future__ import annotations

import base64

import cloudpickle
import httpx
import pytest

import gpupool
from gpupool.errors import Unauthorized
from gpupool.server.auth import call_token, call_token_pod

from .conftest import RemotePool
from .support import until


def call_token_of_this_pod() -> str:
    import os

    return os.environ["GPUPOOL_CALL_TOKEN"]


def slow_answer(seconds: float, value: int) -> int:
    import time

    time.sleep(seconds)
    return value


def _api(pool: RemotePool, token: str) -> httpx.Client:
    return httpx.Client(base_url=pool.server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                        timeout=30)


def test_call_tokens_are_signed_pod_ids() -> None:
    key = b"k" * 32
    token = call_token(key, "w-1-a1-r0")
    assert call_token_pod(key, f"Bearer {token}") == "w-1-a1-r0"
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    for refused in (f"Bearer {forged}", f"Bearer {call_token(b'x' * 32, 'w-1-a1-r0')}", "Bearer gp_tenant",
                    None, f"Basic {token}"):
        with pytest.raises(Unauthorized):
            call_token_pod(key, refused)


def test_a_call_token_works_on_no_other_route_and_dies_with_its_pod(remote_pool: RemotePool) -> None:
    with gpupool.connect(remote_pool.server.url, remote_pool.tokens["alice"]) as pool:
        future = pool.function(call_token_of_this_pod, gpus=0.25).remote()
        api = _api(remote_pool, future.result(timeout=120))
        for method, path in (("GET", "/workloads"), ("GET", f"/workloads/{future.workload_id}"),
                             ("GET", f"/calls/{future.id}"), ("POST", "/calls/sessions"),
                             ("GET", "/whoami"), ("GET", "/nodes")):
            answer = api.request(method, path, json={} if method == "POST" else None)
            assert answer.status_code == 401, (path, answer.text)
        until(lambda: pool.client.workload(future.workload_id).status == "succeeded", 60, "the pod's end")
        until(lambda: api.post("/calls/worker/next", json={"wait_s": 0}).status_code == 401, 10,
              "the token's refusal once its pod ended")
        ended = api.post("/calls/worker/next", json={"wait_s": 0})
        assert "ended" in ended.json()["message"]
        api.close()
    with _api(remote_pool, remote_pool.tokens["alice"]) as api:  # the tenant's own token is no call token
        refused = api.post("/calls/worker/next", json={"wait_s": 0})
        assert refused.status_code == 401 and "call token" in refused.json()["message"]


def test_another_tenant_can_neither_read_nor_answer_a_call(remote_pool: RemotePool) -> None:
    server = remote_pool.server
    with gpupool.connect(server.url, remote_pool.tokens["alice"]) as alice, \
            gpupool.connect(server.url, remote_pool.tokens["bob"]) as bob, \
            alice.session(gpus=0.25) as alice_session, bob.session(gpus=0.25) as bob_session:
        assert bob_session.call(slow_answer, 0, 1) == 1  # bob's worker pod runs
        bob_pod = bob._get_call(bob_session.submit(slow_answer, 0, 2).id, 30)["pod_id"]
        from gpupool.server.services.calls import _key

        key = _key(server.rt.store, create=False)
        assert key is not None
        bob_token = call_token(key, bob_pod)  # as bob's pod holds it
        future = alice_session.submit(slow_answer, 2, 42)
        with _api(remote_pool, bob_token) as api:
            forged = base64.b64encode(cloudpickle.dumps(666)).decode()
            answer = api.post("/calls/worker/next", json={
                "done": {"call_id": future.id, "ok": True, "result": forged}, "wait_s": 0})
            assert answer.status_code == 200 and answer.json()["call_id"] in (None, "")
            assert api.get(f"/calls/{future.id}").status_code == 401
        with _api(remote_pool, remote_pool.tokens["bob"]) as api:
            assert api.get(f"/calls/{future.id}").status_code == 404  # not bob's: not even its existence
            assert api.post(f"/calls/{future.id}/cancel").status_code == 404
            submitted = api.post(f"/calls/sessions/{alice_session.id}/calls", json={"payload": ""})
            assert submitted.status_code == 404
        assert future.result(timeout=60) == 42  # answered by alice's own pod, not bob's forgery
    with _api(remote_pool, server.admin_token) as api:  # the admin reads every tenant's calls
        assert api.get(f"/calls/{future.id}").json()["status"] == "succeeded"
