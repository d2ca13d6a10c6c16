"""API fuzzing: schemathesis against the served OpenAPI schema as the admin, a tenant and no token.

Every operation the schema lists is fuzzed with positive (schema-valid) and negative (schema-invalid)
requests under each principal. A path parameter of a positive request is, one time in two, a real
identifier from the pool (a tenant, queue, node or workload created beforehand), so routes get past
"not found" into the code behind them. Each answer is checked for: a 5xx; the status code, content
type and body against the schema; an error body in the one shape `ErrorBody`; a schema-invalid
request accepted (2xx). Nothing is shrunk: every failure is counted and its first lines kept.

    .venv/bin/python bench/fuzz_api.py --examples 200

starts `gpupool up --provider fake --simulate 2x8xH100` on a loopback port (commands never run),
prints one table per principal and writes bench/results/fuzz_api.json. tests/server/test_fuzz_api.py
runs the same driver in-process over a few examples per operation.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from pydantic import ValidationError
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from gpupool.api.common import ErrorBody

API = "/api/v1"
SCHEMA_PATH = f"{API}/openapi.json"
PRINCIPALS = ("none", "tenant", "admin")
"""In this order: the admin's fuzzing changes state (drains, revokes) the others would then meet."""
MODES = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
SCHEMA_CHECKS = (status_code_conformance, content_type_conformance, response_schema_conformance)
KEPT_FAILURES = 20

Send = Callable[[str, str, dict[str, str], Any], requests.Response]
"""(method, path, headers, json body) -> response: how the setup reaches the server."""


@dataclass
class Tally:
    """What one principal's fuzzing found."""

    operations: int = 0
    examples: int = 0
    server_errors: int = 0
    schema_violations: int = 0
    error_shape_violations: int = 0
    invalid_accepted: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    accepted: list[str] = field(default_factory=list)

    @property
    def problems(self) -> int:
        """What must be 0: 5xx, answers off the schema, errors off the one shape. A schema-invalid
        request accepted is reported beside them: pydantic's lax mode coerces (false -> 0.0)."""
        return self.server_errors + self.schema_violations + self.error_shape_violations

    def note(self, kind: str, label: str, detail: str) -> None:
        kept = self.accepted if kind == "invalid accepted" else self.failures
        if len(kept) < KEPT_FAILURES:
            kept.append(f"{kind}: {label}: {detail[:600]}")


@dataclass
class Pool:
    """What the setup created: the tenant principal's token and real identifiers to fill paths with."""

    admin_token: str
    tenant_token: str
    identifiers: list[str]

    def headers(self, principal: str) -> dict[str, str]:
        token = {"admin": self.admin_token, "tenant": self.tenant_token}.get(principal)
        return {"Authorization": f"Bearer {token}"} if token else {}


def seed_pool(send: Send, admin_token: str, node_names: Iterable[str]) -> Pool:
    """Two tenants (the fuzzing one and another), a queue and a workload each, and a spare token."""
    admin = {"Authorization": f"Bearer {admin_token}"}
    identifiers = [*sorted(set(node_names)), "default"]
    for tenant in ("fuzz-own", "fuzz-other"):
        _ok(send("POST", f"{API}/tenants", admin, {"name": tenant}))
        _ok(send("POST", f"{API}/queues", admin, {"tenant": tenant, "name": "batch", "quota_gpus": 4}))
        created = _ok(send("POST", f"{API}/workloads", admin,
                           {"command": ["true"], "tenant": tenant, "resources": {"gpus": 0.5}}))
        identifiers += [tenant, created["id"]]
        spare = _ok(send("POST", f"{API}/tokens", admin, {"tenant": tenant, "name": "spare"}))
        identifiers.append(spare["id"])
    identifiers += ["batch", "spare"]
    token = _ok(send("POST", f"{API}/tokens", admin, {"tenant": "fuzz-own", "name": "fuzzer"}))["token"]
    return Pool(admin_token=admin_token, tenant_token=token, identifiers=identifiers)


def _ok(response: requests.Response) -> Any:
    if response.status_code >= 300:
        raise RuntimeError(f"setup call failed: {response.status_code} {response.text}")
    return response.json()


def fuzz(schema: Any, pool: Pool, examples: int, base_seed: int = 0,
         principals: Iterable[str] = PRINCIPALS, fewer: Mapping[str, int] | None = None) -> dict[str, Tally]:
    """Fuzz every operation of `schema` under each principal; `examples` per operation and mode
    (`fewer`: a principal sent only the first so many of them).

    The examples are drawn once and sent as each principal in turn, every operation as the first
    principal before any as the next (so the admin's changes meet only the principals after it).
    Drawn with the same seed, each principal was sent the same examples when each drew its own, and
    drawing was two thirds of the time."""
    operations = [result.ok() for result in schema.get_all_operations()]
    drawn = [(mode, _draw(operation, mode, pool.identifiers, examples, base_seed))
             for operation in operations for mode in MODES]
    results = {}
    for principal in principals:
        tally = Tally(operations=len(operations))
        headers = pool.headers(principal)
        limit = (fewer or {}).get(principal, examples)
        for mode, cases in drawn:
            for case in cases[:limit]:
                check_answer(case, case.call(headers=headers), mode, tally)
        results[principal] = tally
    return results


FOLLOWING = ("true", "1", "yes", "on", "t", "y")
"""What the API reads as follow=true."""


def _draw(operation: Any, mode: schemathesis.GenerationMode, identifiers: list[str], examples: int,
          base_seed: int) -> list[schemathesis.Case]:
    """`examples` requests for `operation` in `mode`, as hypothesis draws them with `base_seed`."""
    substitute = mode == schemathesis.GenerationMode.POSITIVE and bool(identifiers)
    cases: list[schemathesis.Case] = []

    @seed(base_seed)
    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), derandomize=False)
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def one(case: schemathesis.Case, data: st.DataObject) -> None:
        if substitute and case.path_parameters:
            for name in sorted(case.path_parameters):
                if data.draw(st.booleans()):
                    case.path_parameters[name] = data.draw(st.sampled_from(identifiers))
        if case.query and str(case.query.get("follow", "")).lower() in FOLLOWING:
            case.query["follow"] = "false"  # a followed event stream never ends: fuzz its finite form
        cases.append(case)

    try:
        one()
    except Unsatisfiable:
        # Negative mode on an operation that takes no input at all: there is nothing to make invalid.
        if mode == schemathesis.GenerationMode.POSITIVE:
            raise
    return cases


def check_answer(case: schemathesis.Case, response: Any, mode: schemathesis.GenerationMode,
                 tally: Tally) -> None:
    """Count the example and every problem its answer shows."""
    label = f"{case.operation.label} [{mode.value}] {case.method} {case.formatted_path} q={case.query}"
    status = response.status_code
    tally.examples += 1
    tally.statuses[str(status)] = tally.statuses.get(str(status), 0) + 1
    if status >= 500:
        tally.server_errors += 1
        sent = getattr(response.request, "body", b"") or b""
        tally.note("5xx", label, f"{status} {response.text} for body {sent[:400]!r}")
    if status >= 400:
        try:
            ErrorBody.model_validate_json(response.content, strict=True)
        except ValidationError as exc:
            tally.error_shape_violations += 1
            tally.note("error shape", label, f"{status} {response.text} ({exc.error_count()} problems)")
    if _failed(case, response, list(SCHEMA_CHECKS)):
        tally.schema_violations += 1
        tally.note("schema", label, _failed(case, response, list(SCHEMA_CHECKS)))
    if mode == schemathesis.GenerationMode.NEGATIVE and status < 400:
        why = _failed(case, response, [negative_data_rejection])
        if why:
            tally.invalid_accepted += 1
            tally.note("invalid accepted", label, f"{status} {why}")


def _failed(case: schemathesis.Case, response: Any, checks: list[Any]) -> str:
    """The report of the checks that fail on this answer, or '' when all pass."""
    try:
        case.validate_response(response, checks=checks)
    except FailureGroup as group:
        return str(group)
    return ""


# --- the long run, against a real `gpupool up` -------------------------------------------------


class _BaseUrlSession(requests.Session):
    def __init__(self, base_url: str) -> None:
        super().__init__()
        self.base_url = base_url

    def send_json(self, method: str, path: str, headers: dict[str, str], body: Any) -> requests.Response:
        return self.request(method, self.base_url + path, headers=headers, json=body, timeout=30)


def _table(results: dict[str, Tally], examples: int, elapsed_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"API fuzzing, {examples} examples per operation and mode ({elapsed_s:.0f} s)")
    for column in ("principal", "operations", "examples tried", "5xx found", "schema violations",
                   "error-shape violations", "invalid accepted", "statuses seen"):
        table.add_column(column)
    for principal, tally in results.items():
        statuses = " ".join(f"{k}:{v}" for k, v in sorted(tally.statuses.items()))
        table.add_row(principal, str(tally.operations), str(tally.examples), str(tally.server_errors),
                      str(tally.schema_violations), str(tally.error_shape_violations),
                      str(tally.invalid_accepted), statuses)
    Console().print(table)
    for principal, tally in results.items():
        for failure in tally.failures + tally.accepted:
            print(f"[{principal}] {failure}")


def main() -> int:
    from _control_plane import gpupool_up, write_json

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=100, help="examples per operation and mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--simulate", default="2x8xH100")
    parser.add_argument("--json", default="", help="output file (default bench/results/fuzz_api.json)")
    args = parser.parse_args()
    with gpupool_up("--provider", "fake", "--simulate", args.simulate) as server:
        http = _BaseUrlSession(server.url)
        nodes = _ok(http.send_json("GET", f"{API}/nodes", {"Authorization": f"Bearer {server.token}"}, None))
        pool = seed_pool(http.send_json, server.token, [n["name"] for n in nodes])
        schema = schemathesis.openapi.from_url(server.url + SCHEMA_PATH)
        start = time.perf_counter()
        results = fuzz(schema, pool, args.examples, args.seed)
        elapsed_s = time.perf_counter() - start
    _table(results, args.examples, elapsed_s)
    out = write_json(args.json, "fuzz_api", {
        "examples_per_operation_and_mode": args.examples, "seed": args.seed, "simulate": args.simulate,
        "elapsed_s": round(elapsed_s, 1), "schemathesis": schemathesis.__version__,
        "principals": {p: {**asdict(t), "problems": t.problems} for p, t in results.items()},
    })
    print(f"wrote {out}")
    return 1 if any(t.problems for t in results.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
