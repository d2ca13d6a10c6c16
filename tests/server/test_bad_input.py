"""Bad input on every field gets a 4xx in the one error shape, naming the field; never a 500."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import Server

API = "/api/v1"
GOOD: dict[str, object] = {"command": ["true"], "resources": {"gpus": 0.25}}


def _with(path: str, value: object) -> dict[str, object]:
    body = json.loads(json.dumps(GOOD))
    keys = path.split(".")
    target = body
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = value
    return body


def _assert_error(answer: object, status: int, mentions: str = "") -> None:
    assert answer.status_code == status, answer.text  # type: ignore[attr-defined]
    body = answer.json()  # type: ignore[attr-defined]
    assert set(body) == {"code", "message", "details"}
    assert body["message"].endswith(".") or body["message"].endswith(")")
    assert mentions in body["message"], body["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("command", []),
        ("command", "true"),
        ("command", [""]),
        ("command", [1]),
        ("command", None),
        ("name", "has space"),
        ("name", "x" * 64),
        ("name", 5),
        ("tenant", "Upper"),
        ("tenant", ""),
        ("queue", "bad_name"),
        ("queue", "-x"),
        ("priority", 1001),
        ("priority", "high"),
        ("priority", 1.5),
        ("replicas", 0),
        ("replicas", 257),
        ("replicas", "two"),
        ("resources.gpus", -1),
        ("resources.gpus", 1.5),
        ("resources.gpus", "lots"),
        ("resources.gpus", 2000),
        ("resources.gpu_memory", "8 parsecs"),
        ("resources.gpu_memory", -5),
        ("resources.gpu_memory", []),
        ("resources.cpu", "four"),
        ("resources.cpu", -1),
        ("resources.memory", "16 GB please"),
        ("resources.memory", -1),
        ("resources.models", "H100"),
        ("resources.models", [""]),
        ("resources.extra", 1),
        ("env", {"1BAD": "x"}),
        ("env", {"K": 1}),
        ("env", ["K=V"]),
        ("workdir", 7),
        ("runtime_estimate_s", -3),
        ("runtime_estimate_s", "soon"),
        ("unknown_field", 1),
    ],
)
def test_each_spec_field(shared_server: Server, field: str, value: object) -> None:
    server = shared_server
    answer = server.client.post(f"{API}/workloads", json=_with(field, value), headers=server.headers())
    _assert_error(answer, 422, field.split(".")[0])
    assert answer.json()["code"] == "invalid_input"


def test_ask_that_no_node_can_hold_is_refused_at_submit(server: Server) -> None:
    body = _with("resources.gpus", 16)
    answer = server.client.post(f"{API}/workloads", json=body, headers=server.headers())
    assert answer.status_code == 422 and answer.json()["message"].startswith("No node has 16 devices: ")


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        (
            "post",
            "/workloads",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            422,
        ),
        ("post", "/workloads", {"content": b"command=true"}, 422),
        ("get", "/workloads?limit=0", {}, 422),
        ("get", "/workloads?limit=abc", {}, 422),
        ("get", "/workloads?limit=100000", {}, 422),
        ("get", "/workloads?offset=-1", {}, 422),
        ("get", "/workloads?status=sleeping", {}, 422),
        ("get", "/workloads/" + "x" * 65, {}, 422),
        ("get", "/workloads/nope", {}, 404),
        ("get", "/workloads/nope/events", {}, 404),
        ("get", "/workloads/nope/logs?rank=-1", {}, 422),
        ("get", "/workloads/nope/logs?stream=stdin", {}, 422),
        ("post", "/workloads/nope/cancel", {}, 404),
        ("get", "/nowhere", {}, 404),
        ("delete", "/workloads", {}, 405),
        ("post", "/tenants", {"json": {"name": "Bad Name"}}, 422),
        ("post", "/tenants", {"json": {}}, 422),
        ("post", "/tenants", {"json": {"name": "ok", "x": 1}}, 422),
        ("post", "/queues", {"json": {"tenant": "default", "name": "q", "quota_gpus": -1}}, 422),
        ("post", "/queues", {"json": {"tenant": "default", "name": "q", "quota_gpus": False}}, 422),
        ("patch", "/queues/default/default", {"json": {"quota_gpus": True}}, 422),
        ("post", "/tenants", {"json": {"name": "b", "max_pending": False}}, 422),
        ("post", "/tenants", {"json": {"name": "b", "max_priority": True}}, 422),
        ("post", "/tokens", {"json": {"tenant": "default", "expires_in_s": True}}, 422),
        ("post", "/queues", {"json": {"tenant": "default", "name": "default"}}, 409),
        ("patch", "/queues/default/none", {"json": {"quota_gpus": 1}}, 404),
        ("patch", "/queues/BAD/x", {"json": {"quota_gpus": 1}}, 422),
        ("post", "/tokens", {"json": {"tenant": "ghost"}}, 404),
        ("post", "/tokens", {"json": {"tenant": "default", "name": "has space"}}, 422),
        ("get", "/queues?tenant=ghost", {}, 200),
        ("post", "/nodes/ghost/cordon", {}, 404),
        ("get", "/nodes/ghost", {}, 404),
    ],
)
def test_bad_requests(
    shared_server: Server, method: str, path: str, kwargs: dict[str, object], status: int
) -> None:
    server = shared_server
    headers = {**server.headers(), **dict(kwargs.pop("headers", {}))}  # type: ignore[call-overload]
    answer = getattr(server.client, method)(f"{API}{path}", headers=headers, **kwargs)
    if status == 200:
        assert answer.status_code == 200
        return
    _assert_error(answer, status)


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_fields = st.sampled_from(
    [
        "command",
        "name",
        "tenant",
        "queue",
        "priority",
        "replicas",
        "resources",
        "resources.gpus",
        "resources.gpu_memory",
        "resources.cpu",
        "resources.memory",
        "resources.models",
        "env",
        "workdir",
        "runtime_estimate_s",
    ]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=_fields, value=_json)
def test_no_input_causes_a_500(shared_server: Server, field: str, value: object) -> None:
    server = shared_server
    answer = server.client.post(f"{API}/workloads", json=_with(field, value), headers=server.headers())
    assert answer.status_code < 500, answer.text
    assert answer.status_code in (201, 403, 404, 409, 422)


_PAD = {f"PAD{i}": "x" * 60000 for i in range(5)}
"""Env values that make a body larger than the fast path takes, so the FastAPI route answers it."""


@pytest.mark.parametrize("route", [False, True], ids=["fast-path", "route"])
@pytest.mark.parametrize(
    ("field", "body", "mentions"),
    [
        ("submit_dir", {"command": ["true"], "submit_dir": "/tmp/\u0000x"}, "U+0000"),
        ("submit_dir", {"command": ["true"], "submit_dir": "/tmp/a\nb"}, "U+000A"),
        ("workdir", {"command": ["true"], "workdir": "/tmp/\u0000"}, "U+0000"),
        ("workdir", {"command": ["true"], "workdir": "/tmp/\u001b[2J"}, "U+001B"),
        ("command.0", {"command": ["tr\u0000ue"]}, "U+0000 at position 2"),
        ("command", {"command": ["true\n"]}, "its first word (the program)"),
        ("command.2", {"command": ["sh", "-c", "echo \u0000"]}, "U+0000 at position 5"),
        ("command.1", {"command": ["echo", "\u0085"]}, "U+0085"),
        ("env.K", {"command": ["true"], "env": {"K": "a\u0000b"}}, "(tab, newline and carriage return"),
        ("env.K", {"command": ["true"], "env": {"K": "\u007f"}}, "U+007F"),
    ],
)
def test_control_characters_are_refused_in_paths_commands_and_env(
    shared_server: Server, field: str, body: dict[str, object], mentions: str, route: bool
) -> None:
    """A NUL in a path, an argument or a variable cannot reach exec or a filesystem call (it raised
    in the launch and held the workload's devices); it is refused at submission with a sentence."""
    server = shared_server
    if route:
        body = {**body, "env": {**dict(body.get("env", {})), **_PAD}}  # type: ignore[call-overload]
    answer = server.client.post(f"{API}/workloads", json=body, headers=server.headers())
    _assert_error(answer, 422, f"{field!r}")
    assert mentions in answer.json()["message"], answer.json()["message"]
    assert "remove it" in answer.json()["message"]


def test_unpaired_surrogate_is_refused_on_the_route(shared_server: Server) -> None:
    """Python's json (the route's parser) accepts an unpaired surrogate, which exec cannot encode."""
    server = shared_server
    text = json.dumps({"command": ["echo", "\ud800"], "env": _PAD})
    answer = server.client.post(f"{API}/workloads", content=text.encode(),
                                headers={**server.headers(), "content-type": "application/json"})
    _assert_error(answer, 422, "'command.1'")


@pytest.mark.parametrize("text", ["sh -c 'a\tb'\r\n", "line one\nline two"])
def test_tab_newline_and_return_are_allowed_in_arguments_and_env(shared_server: Server, text: str) -> None:
    server = shared_server
    body = {"command": ["sh", "-c", text], "env": {"SCRIPT": text}}
    answer = server.client.post(f"{API}/workloads", json=body, headers=server.headers())
    assert answer.status_code == 201, answer.text


def test_control_characters_are_refused_in_a_function_session_env(shared_server: Server) -> None:
    server = shared_server
    body = {"python": "3.11", "env": {"K": "\u0000"}}
    answer = server.client.post(f"{API}/calls/sessions", json=body, headers=server.headers())
    _assert_error(answer, 422, "'env.K'")


def test_a_sessions_environment_past_a_specs_bound_is_refused_not_a_500(server: Server) -> None:
    """A remote-function session's body may be large (its first call's pickle), but its environment
    becomes its workload's: past 128 KiB the workload's spec was refused after the request was
    taken, a 500."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    body = {"python": python, "env": {f"V{i}": "x" * 60_000 for i in range(4)}}
    answer = server.client.post("/api/v1/calls/sessions", json=body, headers=server.headers())
    assert answer.status_code == 422, answer.text
    assert "more than the 128 KiB a spec may hold" in answer.json()["message"]
