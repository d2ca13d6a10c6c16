"""A hostile tenant cannot make the server read or store more than its limits: request bodies, specs."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

from fakes import ManualProvider

from conftest import Server
from factories import node
from gpupool.agent.runner import Runner
from gpupool.api.workloads import MAX_COMMAND_BYTES, MAX_ENV_BYTES, MAX_ENV_VARS
from gpupool.core.units import parse_size_bytes
from gpupool.pods import LogChunk, PodLaunch
from gpupool.server.settings import DEFAULT_MAX_REQUEST_BODY_BYTES, Settings
from live import live_server

API = "/api/v1"
MIB = 2**20


def _call(app: Any, path: str, headers: list[tuple[bytes, bytes]], chunks: int,
          chunk_bytes: int = MIB) -> tuple[int, dict[str, Any], int]:
    """POST `chunks` chunks of `chunk_bytes` to `path` at the ASGI level: the status, the JSON answer
    and how many chunks the app pulled."""
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if pulled >= chunks:
            return {"type": "http.disconnect"}
        pulled += 1
        return {"type": "http.request", "body": b"x" * chunk_bytes, "more_body": pulled < chunks}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": headers, "client": ("127.0.0.1", 5000),
             "server": ("127.0.0.1", 8765)}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body), pulled


def _auth(server: Server) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {server.admin_token}".encode()),
            (b"content-type", b"application/json")]


def test_a_64_mib_body_with_its_length_is_refused_before_a_byte_is_read(server: Server) -> None:
    headers = [*_auth(server), (b"content-length", str(64 * MIB).encode())]
    status, answer, pulled = _call(server.client.app, f"{API}/workloads", headers, chunks=64)
    assert status == 413
    assert answer["code"] == "too_large"
    assert "larger than this pool accepts (1 MiB)" in answer["message"]
    assert pulled == 0


def test_a_chunked_64_mib_body_is_refused_at_the_chunk_that_passes_the_limit(server: Server) -> None:
    # No Content-Length: the submission fast path hands it to the route, which reads it; the count
    # stops it at the second MiB, whichever route reads it.
    # Remote calls have room for a 16 MiB pickle in base64 (about 21.4 MiB), fabric telemetry for
    # 100,000 port samples (32 MiB), and not a MiB more.
    for path, after in ((f"{API}/workloads", 2), (f"{API}/tenants", 2), (f"{API}/calls/sessions", 22),
                        (f"{API}/fabric/telemetry", 33)):
        status, answer, pulled = _call(server.client.app, path, _auth(server), chunks=64)
        assert (status, answer["code"]) == (413, "too_large"), (path, answer)
        assert answer["message"].startswith("The request body is larger than this pool accepts")
        assert pulled == after, path


def test_a_body_under_the_limit_reaches_the_route(server: Server) -> None:
    body = json.dumps({"command": ["true"], "env": {"PAD": "x" * 60_000}}).encode()
    answer = server.client.post(f"{API}/workloads", content=body,
                                headers={**server.headers(), "Content-Type": "application/json"})
    assert answer.status_code == 201, answer.text


def test_remote_calls_keep_room_for_their_payloads(server: Server) -> None:
    # A call's pickled arguments may weigh 16 MiB: 2 MiB reaches the route (an unknown session: 404).
    body = json.dumps({"payload": "A" * (2 * MIB)}).encode()
    answer = server.client.post(f"{API}/calls/sessions/nosuch/calls", content=body,
                                headers={**server.headers(), "Content-Type": "application/json"})
    assert answer.status_code == 404, answer.text


def test_a_real_server_answers_413_without_waiting_for_the_body(tmp_path: Path) -> None:
    with live_server(tmp_path, ManualProvider([node("n0", devices=1, model="H100")])) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(f"POST {API}/workloads HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                         f"{srv.admin_token}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {64 * MIB}\r\n\r\n".encode() + b"{")
            answer = b""
            while chunk := sock.recv(65536):  # the body never comes: only an early answer does
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        assert b'"code":"too_large"' in answer


def test_the_limit_is_a_setting_with_a_sentence_for_bad_values() -> None:
    assert Settings().max_request_body_bytes == DEFAULT_MAX_REQUEST_BODY_BYTES == MIB
    assert Settings().with_env({"GPUPOOL_MAX_REQUEST_BODY": "4MiB"}).max_request_body_bytes == 4 * MIB
    assert parse_size_bytes("512k", "x") == 512 * 1024
    for bad, said in (("lots", "must be a size such as"), ("1", "at least 64 KiB")):
        try:
            Settings().with_env({"GPUPOOL_MAX_REQUEST_BODY": bad})
        except Exception as exc:
            assert said in str(exc)
        else:
            raise AssertionError(f"{bad!r} was accepted")


def test_a_raised_limit_lets_larger_bodies_through(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory()
    server.rt.settings = Settings(data_dir=tmp_path, max_request_body_bytes=4 * MIB)
    from gpupool.server.app import create_app

    app = create_app(server.rt, run_loop=False)
    status, _, pulled = _call(app, f"{API}/tenants", _auth(server), chunks=3)
    assert status == 422 and pulled == 3  # read in full, then refused as not JSON, not as too large


def test_a_command_above_its_cap_is_refused_with_a_sentence(server: Server) -> None:
    words = ["echo", *["y" * 1023] * (MAX_COMMAND_BYTES // 1024 + 1)]
    answer = server.client.post(f"{API}/workloads", json={"command": words}, headers=server.headers())
    assert answer.status_code == 422, answer.text
    assert "the command is" in answer.json()["message"]
    assert "128 KiB" in answer.json()["message"]


def test_an_environment_above_its_caps_is_refused_with_a_sentence(server: Server) -> None:
    big = {f"V{i}": "z" * 1000 for i in range(MAX_ENV_BYTES // 1000 + 1)}
    many = {f"V{i}": "" for i in range(MAX_ENV_VARS + 1)}
    for env, said in ((big, "the environment is"), (many, f"more than the {MAX_ENV_VARS}")):
        answer = server.client.post(f"{API}/workloads", json={"command": ["true"], "env": env},
                                    headers=server.headers())
        assert answer.status_code == 422, answer.text
        assert said in answer.json()["message"]


def test_ten_maximal_specs_keep_a_listing_small(server: Server) -> None:
    # The attack: ten 10 MB specs made every listing of 100 weigh 98.6 MB. Now a spec is at
    # most its caps: the largest one that passes is stored and listed, and ten of them stay small.
    spec = {"command": ["echo", "y" * 60_000, "y" * 60_000, "y" * (MAX_COMMAND_BYTES - 120_100)],
            "env": {"A": "z" * 60_000, "B": "z" * 60_000, "C": "z" * (MAX_ENV_BYTES - 120_100)}}
    for _ in range(10):
        answer = server.client.post(f"{API}/workloads", json=spec, headers=server.headers())
        assert answer.status_code == 201, answer.text
    listing = server.client.get(f"{API}/workloads?limit=100", headers=server.headers())
    assert listing.status_code == 200
    assert len(listing.content) < 10 * (MAX_COMMAND_BYTES + MAX_ENV_BYTES + 64 * 1024)


def test_an_array_cannot_multiply_a_large_spec_into_gigabytes(server: Server) -> None:
    # One 256 KiB spec with 10,000 tasks would store 2.5 GB: refused before anything is stored
    spec = {"command": ["echo", "y" * 60_000], "env": {"A": "z" * 60_000}, "array": "0-9999"}
    answer = server.client.post(f"{API}/workloads", json=spec, headers=server.headers())
    assert answer.status_code == 422, answer.text
    message = answer.json()["message"]
    assert "stores its spec once per task: 10000 tasks of 117 KiB is 1145 MiB" in message
    assert "more than the 64 MiB an array may hold" in message
    listing = server.client.get(f"{API}/workloads?limit=1", headers=server.headers())
    assert listing.json()["total"] == 0
    small = server.client.post(f"{API}/workloads", json={**spec, "array": "0-99"}, headers=server.headers())
    assert small.status_code == 201, small.text


class _LoggingProvider(ManualProvider):
    """Pods 'run' at once; each has a real log, written and read by a real Runner."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__([node("n0", devices=1, model="H100")], exit_code=0)
        self.runner = Runner(state_dir)

    def launch(self, pod: PodLaunch) -> None:
        super().launch(pod)
        self.runner.start(pod.pod_id, ["echo", "hello"], env={"PATH": "/usr/bin:/bin"})
        self.runner.wait(pod.pod_id, 10)

    def read_log(self, pod_id: str, stream: str = "stdout", offset: int = 0) -> LogChunk:
        return self.runner.read_log(pod_id, stream, offset)


def test_a_log_offset_past_the_end_gets_a_clean_answer(server_factory: Any, tmp_path: Path) -> None:
    provider = _LoggingProvider(tmp_path / "agent")
    server = server_factory(provider=provider)
    try:
        created = server.created("/workloads", {"command": ["echo", "hello"]})
        server.wait_for(lambda: server.status(str(created["id"])) == "succeeded")
        logs = f"{API}/workloads/{created['id']}/logs"
        assert server.client.get(logs, headers=server.headers()).json()["text"] == "hello\n"
        for offset in (2**44, 2**53):  # 2**44 was a 500 with a traceback (ext4 refuses the seek)
            answer = server.client.get(logs, params={"offset": offset}, headers=server.headers())
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert (body["text"], body["offset"], body["complete"]) == ("", 6, True)
        for offset in (-1, 2**60):
            answer = server.client.get(logs, params={"offset": offset}, headers=server.headers())
            assert answer.status_code == 422 and "offset" in answer.json()["message"], answer.text
    finally:
        provider.runner.close()


def test_an_exec_asked_for_a_rank_or_window_out_of_range_is_told_so(server: Server) -> None:
    """Numbers past any rank or terminal (a rank of 10**30, which the store cannot hold, or 1e400,
    which JSON reads as infinity) are refused with a sentence, not a dropped socket."""
    cases = [({"rank": 10**30}, "The rank must be a pod's rank in its gang, 0 to 2147483647, not 1"),
             ({"rank": -1}, "not -1"),
             ({"rows": 10**6, "cols": 80}, "rows and columns are 0 to 9999"),
             ({"cols": 1e400}, 'Send {"command"')]
    api, admin = server.client, server.headers()
    assert api.post("/api/v1/tenants", json={"name": "execs"}, headers=admin).status_code == 201
    token = api.post("/api/v1/tokens", json={"tenant": "execs"}, headers=admin).json()["token"]
    made = api.post("/api/v1/workloads", json={"command": ["serve"]}, headers=server.headers(token))
    assert made.status_code == 201, made.text
    wid = made.json()["id"]
    server.wait_for(lambda: api.get(f"/api/v1/workloads/{wid}", headers=admin).json()["status"] == "running")
    for extra, words in cases:
        raw = json.dumps({"command": ["id"], **extra}).replace("Infinity", "1e400")
        with api.websocket_connect(f"/api/v1/workloads/{wid}/exec", headers=server.headers(token)) as ws:
            ws.send_text(raw)
            answer = json.loads(ws.receive_text())
        assert answer["status"] == 422 and words in answer["error"], (extra, answer)
