"""`gpupool service create|ls|show|scale|update|delete`: inference services (docs/services.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gpupool.cli._common import client, reports_errors
from gpupool.cli.output import Column, Format, OutputOption, visible
from gpupool.errors import InvalidInput

app = typer.Typer(
    help="Inference services: create, ls, show, scale, update, delete, partners.\n\n"
    "Example: gpupool service create chat --gpus 0.25 --min 1 --max 4 "
    "--readiness-http /healthz -- python -m myapp.serve",
    no_args_is_help=True,
)
TenantOption = Annotated[str | None, typer.Option("--tenant", "-t", help="Admin only: the tenant's.")]
Command = Annotated[list[str] | None, typer.Argument(help="The replica's program and arguments (after --).")]
FileOption = Annotated[
    Path | None, typer.Option("--file", "-f", help="A YAML spec; flags override its fields.")
]
GpusOption = Annotated[
    float | None, typer.Option("--gpus", help="Per replica: a fraction (0.25) or devices.")
]
GpuMemoryOption = Annotated[
    str | None, typer.Option("--gpu-memory", help="Device memory per replica (8GiB).")
]
CpuOption = Annotated[str | None, typer.Option("--cpu", help="Cores per replica (2, 500m).")]
MemoryOption = Annotated[str | None, typer.Option("--memory", help="Host memory per replica (4GiB).")]
PortEnvOption = Annotated[
    str | None, typer.Option("--port-env", help="The variable giving each replica its port (default PORT).")
]
MinOption = Annotated[int | None, typer.Option("--min", help="Fewest replicas (default 1).")]
MaxOption = Annotated[int | None, typer.Option("--max", help="Most replicas (default 1).")]
ConcurrencyOption = Annotated[
    float | None,
    typer.Option("--target-concurrency", help="Requests in flight per replica to aim at (at least 0.001)."),
]
RpsOption = Annotated[
    float | None, typer.Option("--target-rps", help="Requests/s per replica to aim at (at least 0.001).")
]
ReadyHttpOption = Annotated[
    str | None,
    typer.Option(
        "--readiness-http", help="Ready once GET PATH answers 2xx/3xx (default: once its port accepts)."
    ),
]
ReadyTcpOption = Annotated[bool, typer.Option("--readiness-tcp", help="Ready once its port accepts.")]
LiveHttpOption = Annotated[
    str | None, typer.Option("--liveness-http", help="Replaced once GET PATH keeps failing.")
]
LiveTcpOption = Annotated[bool, typer.Option("--liveness-tcp", help="Replaced once its port keeps refusing.")]
PeriodOption = Annotated[float | None, typer.Option(
    "--probe-period", help="Seconds between the probes given with --readiness-*/--liveness-* (0.1-3600; 2).")]
EnvOption = Annotated[list[str] | None, typer.Option("--env", "-e", help="NAME=VALUE; repeatable.")]


def _check_period(period: float | None, probes: tuple[str | None, bool, str | None, bool]) -> None:
    """--probe-period within ProbeSpec's bounds, and only with a probe it applies to (it was dropped
    without a word otherwise, and a bad value was refused as the probe's timeout_s)."""
    if period is None:
        return
    from gpupool.api.services import MAX_PERIOD_S

    if not 0.1 <= period <= MAX_PERIOD_S:  # nan and inf too
        raise InvalidInput(f"--probe-period takes seconds from 0.1 to {MAX_PERIOD_S:g}, got {period:g}.")
    if not any(probe not in (None, False) for probe in probes):
        raise InvalidInput("--probe-period sets how often the probes given with --readiness-http, "
                           "--readiness-tcp, --liveness-http or --liveness-tcp run; give one of those with "
                           "it (the default readiness probe runs every 2 seconds).")


def _probe(http_path: str | None, tcp: bool, period: float | None, flag: str) -> dict[str, Any] | None:
    if http_path is not None and tcp:
        raise typer.BadParameter(f"Give {flag}-http PATH or {flag}-tcp, not both.")
    probe: dict[str, Any] | None = None
    if http_path is not None:
        probe = {"kind": "http", "path": http_path}
    elif tcp:
        probe = {"kind": "tcp"}
    if probe is not None and period is not None:
        probe["period_s"] = period
        probe["timeout_s"] = min(period, 1.0)
    return probe


def _env(items: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--env takes NAME=VALUE, not {item!r}.")
        env[key] = value
    return env


def _read_file(path: Path) -> dict[str, Any]:
    from gpupool.cli.submit_fast import UsageError, _read_file

    try:
        return dict(_read_file(str(path)))
    except UsageError as exc:
        raise InvalidInput(str(exc)) from None


def _fields(
    gpus: float | None,
    gpu_memory: str | None,
    cpu: str | None,
    memory: str | None,
    port_env: str | None,
    low: int | None,
    high: int | None,
    concurrency: float | None,
    rps: float | None,
    readiness: dict[str, Any] | None,
    liveness: dict[str, Any] | None,
    public: bool | None,
    env: list[str] | None,
    command: list[str] | None,
    base: dict[str, Any],
) -> dict[str, Any]:
    """The spec fields the flags give, over `base` (a -f file's)."""
    spec = dict(base)
    resources = dict(spec.get("resources") or {})
    for key, value in (("gpus", gpus), ("gpu_memory", gpu_memory), ("cpu", cpu), ("memory", memory)):
        if value is not None:
            resources[key] = value
    if resources:
        spec["resources"] = resources
    given: dict[str, object] = {
        "port_env": port_env,
        "min_replicas": low,
        "max_replicas": high,
        "target_concurrency": concurrency,
        "target_rps": rps,
        "readiness": readiness,
        "liveness": liveness,
        "public": public,
    }
    spec.update({key: value for key, value in given.items() if value is not None})
    if env:
        spec["env"] = {**(spec.get("env") or {}), **_env(env)}
    if command:
        spec["command"] = command
    return spec


_FIELD_FLAGS = (
    ("resources.gpus", "--gpus", "gpus"), ("resources.gpu_memory", "--gpu-memory", "gpu_memory"),
    ("resources.cpu", "--cpu", "cpu"), ("resources.memory", "--memory", "memory"),
    ("port_env", "--port-env", "port_env"), ("min_replicas", "--min", "low"),
    ("max_replicas", "--max", "high"),
    ("target_concurrency", "--target-concurrency", "target_concurrency"),
    ("target_rps", "--target-rps", "target_rps"), ("env", "--env", "env"),
    ("replicas", "--replicas", "replicas"),
    ("priority_class", "--priority-class", "priority_class"), ("queue", "--queue", "queue"),
    ("tenant", "--tenant", "tenant"), ("role", "--role", "role"), ("pair_with", "--pair-with", "pair_with"),
)
"""A spec field, the flag that sets it, and that flag's parameter name here."""


def _given(options: dict[str, Any]) -> dict[str, str]:
    """The spec fields the flags in `options` (a command's parameters) set: field -> flag."""
    return {field: flag for field, flag, param in _FIELD_FLAGS if options.get(param) not in (None, [])}


def _check_bounds(spec: dict[str, Any], given: dict[str, str]) -> None:
    """--min above --max, said with the flags (or fields of the -f file, or defaults) that set them."""
    low, high = spec.get("min_replicas", 1), spec.get("max_replicas", 1)
    if not (isinstance(low, int) and isinstance(high, int)) or low <= high:
        return

    def said(field: str, flag: str, value: int) -> str:
        if field in given or field not in spec:  # a flag, or the flag's default
            return f"{flag} {value}" + ("" if field in given else " (the default)")
        return f"{field} {value}"  # the -f file's

    fewest, most = said("min_replicas", "--min", low), said("max_replicas", "--max", high)
    raise InvalidInput(f"{fewest} is above {most}; the fewest replicas cannot exceed the most.")


def _check(spec: dict[str, Any], given: dict[str, str]) -> None:
    """Refuse here what the server would (exit 2 with the rule), before any connection, naming the
    flags the user typed rather than the spec's fields."""
    from pydantic import ValidationError

    from gpupool.api.services import ServiceSpec
    from gpupool.cli.submit_fast import in_flag_terms
    from gpupool.server.validation import message

    _check_bounds(spec, given)
    try:
        ServiceSpec.model_validate(spec)
    except ValidationError as exc:
        raise InvalidInput(in_flag_terms(message([dict(e) for e in exc.errors()])[0], given)) from None


@app.command()
@reports_errors
def create(
    name: Annotated[str, typer.Argument(help="Its name: lower-case letters, digits and '-'.")],
    command: Command = None,
    file: FileOption = None,
    gpus: GpusOption = None,
    gpu_memory: GpuMemoryOption = None,
    cpu: CpuOption = None,
    memory: MemoryOption = None,
    port_env: PortEnvOption = None,
    low: MinOption = None,
    high: MaxOption = None,
    replicas: Annotated[
        int | None, typer.Option("--replicas", help="Replicas at first (default --min).")
    ] = None,
    target_concurrency: ConcurrencyOption = None,
    target_rps: RpsOption = None,
    readiness_http: ReadyHttpOption = None,
    readiness_tcp: ReadyTcpOption = False,
    liveness_http: LiveHttpOption = None,
    liveness_tcp: LiveTcpOption = False,
    probe_period: PeriodOption = None,
    public: Annotated[
        bool, typer.Option("--public", help="Answer requests without the tenant's token.")
    ] = False,
    priority_class: Annotated[
        str | None, typer.Option("--priority-class", help="Default: the pool's serving.priority_class.")
    ] = None,
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="The tenant's queue (default).")] = None,
    env: EnvOption = None,
    tenant: TenantOption = None,
    role: Annotated[str | None, typer.Option(
        "--role", help="prefill or decode: this half of a prefill/decode pair (with --pair-with).")] = None,
    pair_with: Annotated[str | None, typer.Option(
        "--pair-with", help="The service of the opposite role (yours; it may be created later).")] = None,
) -> None:
    """Create a service: its replicas run COMMAND, each told its port in $PORT, probed by the pool.

    Example: gpupool service create chat --gpus 0.25 --min 1 --max 4 --readiness-http /healthz -- ./serve

    A prefill/decode pair: gpupool service create pre --role prefill --pair-with dec -- ./prefill
    (and dec with --role decode --pair-with pre); their replicas are placed near each other on the
    fabric and told each other's endpoints (docs/services.md).

    Exit codes: 0 created, 2 bad usage (--min above --max, a target of 0) or the name is taken, 3 tenant
    or queue not found, 4 server unreachable.
    """
    given = _given(locals())
    _check_period(probe_period, (readiness_http, readiness_tcp, liveness_http, liveness_tcp))
    base = _read_file(file) if file is not None else {}
    spec = _fields(
        gpus,
        gpu_memory,
        cpu,
        memory,
        port_env,
        low,
        high,
        target_concurrency,
        target_rps,
        _probe(readiness_http, readiness_tcp, probe_period, "--readiness"),
        _probe(liveness_http, liveness_tcp, probe_period, "--liveness"),
        public or None,
        env,
        command,
        base,
    )
    spec["name"] = name
    for key, value in (
        ("replicas", replicas),
        ("priority_class", priority_class),
        ("queue", queue),
        ("tenant", tenant),
        ("role", role),
        ("pair_with", pair_with),
    ):
        if value is not None:
            spec[key] = value
    if not spec.get("command"):
        raise typer.BadParameter("Give the replica's command after -- (or command: in the -f file).")
    _check(spec, given)
    with client() as pool:
        out = pool.create_service(spec)
    print(out.name)


@app.command()
@reports_errors
def partners(
    name: Annotated[str, typer.Argument(help="A service with --role and --pair-with.")],
    tenant: TenantOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="The whole answer as JSON.")] = False,
) -> None:
    """Print the ready endpoints (host:port, one a line) of the service's partner in its pair.

    Example: gpupool service partners pre

    Exit codes: 0 shown, 2 the service is not half of a pair, 3 no such service.
    """
    with client() as pool:
        out = pool.service_partners(name, tenant)
    if as_json:
        print(json.dumps(out.model_dump(mode="json"), indent=2))
        return
    for endpoint in out.endpoints:
        print(endpoint)


@app.command("ls")
@reports_errors
def list_services(tenant: TenantOption = None, output: OutputOption = Format.TABLE) -> None:
    """List services: state, ready and desired replicas, bounds.

    Example: gpupool service ls -o name
    """
    from gpupool.cli.output import render

    with client() as pool:
        found = pool.services(tenant.strip().lower() if tenant else None)
    columns: list[Column[Any]] = [
        Column("NAME", lambda s: s.name, key=True),
        Column("TENANT", lambda s: s.tenant, squeeze=True),
        Column("STATE", lambda s: s.state),
        Column("READY", lambda s: f"{s.ready_replicas}/{s.desired}"),
        Column("MIN", lambda s: str(s.min_replicas)),
        Column("MAX", lambda s: str(s.max_replicas)),
        Column("GEN", lambda s: str(s.generation)),
        Column("PUBLIC", lambda s: "yes" if s.public else "no"),
        Column("ERROR", lambda s: s.last_probe_error, squeeze=True),
    ]
    render(output, found, columns, key=lambda s: f"{s.tenant}/{s.name}", title=f"{len(found)} service(s)")


@app.command()
@reports_errors
def show(
    name: Annotated[str, typer.Argument(help="The service's name.")],
    tenant: TenantOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="The whole answer as JSON.")] = False,
) -> None:
    """Show a service: its replicas (status, readiness, endpoint), version and recent events.

    Example: gpupool service show chat --json

    Exit codes: 0 shown, 3 no such service.
    """
    with client() as pool:
        out = pool.service(name, tenant)
    if as_json:
        print(json.dumps(out.model_dump(mode="json"), indent=2))
        return
    print(
        f"{out.name}  tenant={out.tenant}  state={out.state}  ready={out.ready_replicas}/{out.desired}  "
        f"min={out.min_replicas} max={out.max_replicas}  generation={out.generation} version={out.version}"
    )
    print(f"url: {out.url}" if out.url else
          "url: none (this pool routes no service traffic: start it with gpupool up --serve-port PORT)")
    if out.last_probe_error:
        print(visible(f"last error: {out.last_probe_error}"))
    for r in out.replicas:
        where = f"{r.host}:{r.port}" if r.host else f"(port {r.port})"
        print(f"  {r.workload_id}  {r.status:<9} {r.ready:<9} gen {r.generation}  {r.node or '-'}  {where}")
    for e in out.events:
        print(visible(f"  event {e.reason}: {e.message}"))


@app.command()
@reports_errors
def scale(
    name: Annotated[str, typer.Argument(help="The service's name.")],
    replicas: Annotated[int, typer.Argument(help="Desired replicas (clamped to --min/--max).", min=0)],
    expected_version: Annotated[
        int | None, typer.Option("--expected-version", help="Only if the service is still at this version.")
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Said in the scale event.")] = "",
    tenant: TenantOption = None,
) -> None:
    """Set how many replicas a service should have.

    Example: gpupool service scale chat 3 --expected-version 7

    Exit codes: 0 set, 2 the service changed since --expected-version, 3 no such service.
    """
    with client() as pool:
        out = pool.scale_service(
            name, replicas, expected_version=expected_version, reason=reason, tenant=tenant
        )
    print(f"{out.name} desired={out.desired} version={out.version}")


@app.command()
@reports_errors
def update(
    name: Annotated[str, typer.Argument(help="The service's name.")],
    command: Command = None,
    file: FileOption = None,
    gpus: GpusOption = None,
    gpu_memory: GpuMemoryOption = None,
    cpu: CpuOption = None,
    memory: MemoryOption = None,
    port_env: PortEnvOption = None,
    low: MinOption = None,
    high: MaxOption = None,
    target_concurrency: ConcurrencyOption = None,
    target_rps: RpsOption = None,
    readiness_http: ReadyHttpOption = None,
    readiness_tcp: ReadyTcpOption = False,
    liveness_http: LiveHttpOption = None,
    liveness_tcp: LiveTcpOption = False,
    probe_period: PeriodOption = None,
    public: Annotated[
        bool | None,
        typer.Option("--public/--private", help="Whether it answers requests without the tenant's token."),
    ] = None,
    env: EnvOption = None,
    tenant: TenantOption = None,
) -> None:
    """Change a service; a change of what its replicas run rolls them over (max_surge, max_unavailable).

    Example: gpupool service update chat --max 8

    Exit codes: 0 changed, 2 bad usage or it changed meanwhile, 3 no such service.
    """
    _check_period(probe_period, (readiness_http, readiness_tcp, liveness_http, liveness_tcp))
    if low is not None and high is not None:
        _check_bounds({"min_replicas": low, "max_replicas": high},
                      {"min_replicas": "--min", "max_replicas": "--max"})
    base = _read_file(file) if file is not None else {}
    changes = _fields(
        gpus,
        gpu_memory,
        cpu,
        memory,
        port_env,
        low,
        high,
        target_concurrency,
        target_rps,
        _probe(readiness_http, readiness_tcp, probe_period, "--readiness"),
        _probe(liveness_http, liveness_tcp, probe_period, "--liveness"),
        public,
        env,
        command,
        base,
    )
    changes.pop("name", None)
    if not changes:
        raise typer.BadParameter("Say what to change (a flag, a -f file, or the command after --).")
    with client() as pool:
        out = pool.update_service(name, changes, tenant)
    print(f"{out.name} generation={out.generation} version={out.version}")


@app.command()
@reports_errors
def delete(
    name: Annotated[str, typer.Argument(help="The service's name.")], tenant: TenantOption = None
) -> None:
    """Stop a service's replicas and delete it.

    Example: gpupool service delete chat

    Exit codes: 0 deleted, 3 no such service.
    """
    with client() as pool:
        out = pool.delete_service(name, tenant)
    print(f"deleted {out.name}")


@app.callback()
def _group() -> None:
    """Inference services: create, ls, show, scale, update, delete."""
