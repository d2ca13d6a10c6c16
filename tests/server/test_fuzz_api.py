"""API fuzzing (bounded): every route the served schema lists, as the admin, a tenant and no token.

No 5xx, every answer valid against the schema, every error in the one shape. The driver is
bench/fuzz_api.py, whose long run is recorded in docs/experiments/reliability.md; here a few deterministic
examples per operation keep it inside `make test`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fakes import ManualProvider
from schemathesis.python import asgi

from conftest import make_runtime
from factories import node
from gpupool.server.app import create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
fuzz_api: Any = importlib.import_module("fuzz_api")

EXAMPLES = {"admin": 12, "tenant": 12, "none": 4}
"""Per operation, mode and principal (about 50 operations). Without a token every route but /health
answers 401 before it reads the request, so a few examples (the first of those drawn for the others)
reach all it can; the long run with 100 per operation is bench/fuzz_api.py's."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """The app served in-process (with its control loop) and its pool of real identifiers."""
    data_dir = tmp_path_factory.mktemp("fuzz")
    provider = ManualProvider([node("n0", devices=8, model="H100"), node("n1", devices=4, model="A100")])
    rt, admin_token = make_runtime(f"sqlite:///{data_dir / 'store.sqlite'}", data_dir, provider)
    app = create_app(rt)
    try:
        with asgi.get_client(app) as client:

            def send(method: str, path: str, headers: dict[str, str], body: Any) -> Any:
                return client.request(method, path, headers=headers, json=body)

            pool = fuzz_api.seed_pool(send, admin_token or "", ["n0", "n1"])
            schema = schemathesis.openapi.from_asgi(fuzz_api.SCHEMA_PATH, app)
            yield schema, pool
    finally:
        asgi.shutdown_lifespans()
        rt.store.close()


def test_fuzz_every_route_without_a_token_as_a_tenant_and_as_the_admin(served: tuple[Any, Any]) -> None:
    """The same examples sent as each, drawn once (`fuzz_api.fuzz`): the first few of each
    operation without a token (every route but /health answers 401, with no 5xx and a valid answer),
    then all of them as the tenant and then as the admin."""
    schema, pool = served
    assert EXAMPLES["tenant"] == EXAMPLES["admin"]
    tallies = fuzz_api.fuzz(schema, pool, EXAMPLES["admin"], principals=["none", "tenant", "admin"],
                            fewer={"none": EXAMPLES["none"]})
    for principal, tally in tallies.items():
        assert tally.operations >= 19, "the schema lists fewer operations than the API has"
        assert tally.examples >= tally.operations * 2, principal
        assert tally.problems == 0, "\n".join(tally.failures)
    for principal in ("tenant", "admin"):
        assert tallies[principal].statuses.get("200", 0) > 0, (principal, tallies[principal].statuses)
    assert tallies["tenant"].examples == tallies["admin"].examples > tallies["none"].examples
    assert tallies["tenant"].statuses != tallies["admin"].statuses  # each was answered as itself
    anonymous = tallies["none"]
    assert set(anonymous.statuses) <= {"200", "401", "404", "405", "422"}, anonymous.statuses
    assert anonymous.statuses.get("401", 0) >= anonymous.operations


def test_a_body_that_is_not_utf8_is_invalid_input(served: tuple[Any, Any]) -> None:
    """Found by the fuzzer: the framework's undocumented 400 for an undecodable body is now a 422."""
    schema, pool = served
    with asgi.get_client(schema.app) as client:
        answer = client.post(f"{fuzz_api.API}/queues", data=b"\xff\xfe{", headers={
            **pool.headers("admin"), "Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "invalid_input"
    assert "not valid JSON" in answer.json()["message"]


@pytest.mark.parametrize("body", [
    b'{"command": ["true"], "resources": {"cpu": "inf"}}',
    b'{"command": ["true"], "resources": {"cpu": 1e400}}',
    b'{"command": ["true"], "resources": {"cpu": "1e306"}}',
    b'{"command": ["true"], "resources": {"gpu_memory": "' + b"9" * 320 + b'TiB"}}',
    b'{"command": ["true"], "runtime_estimate_s": 1e400}',
])
def test_amounts_beyond_a_float_are_invalid_input(served: tuple[Any, Any], body: bytes) -> None:
    """Found by the fuzzer: these answered 500 (or, for the estimate, stored a workload whose every
    read answered 500); now each is a 422 naming the field, and the listing still reads."""
    schema, pool = served
    with asgi.get_client(schema.app) as client:
        headers = {**pool.headers("tenant"), "Content-Type": "application/json"}
        answer = client.post(f"{fuzz_api.API}/workloads", data=body, headers=headers)
        assert answer.status_code == 422, answer.text
        assert answer.json()["code"] == "invalid_input"
        assert answer.json()["message"].startswith("Field '")
        assert client.get(f"{fuzz_api.API}/workloads", headers=headers).status_code == 200
