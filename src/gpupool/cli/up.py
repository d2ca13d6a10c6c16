"""`gpupool up`: start the API server, the scheduler loop and the local agent in one process."""

from __future__ import annotations

import signal
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpupool.cli._common import check_policy, default_policy, directory, policy_names_text
from gpupool.server.settings import (
    DEFAULT_HOST,
    DEFAULT_MAX_POD_LOG_BYTES,
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    DEFAULT_PORT,
    DEFAULT_TENANT_OPEN_REQUESTS,
    DEFAULT_TENANT_REQUEST_RATE,
)

if TYPE_CHECKING:
    from gpupool.config import PoolConfig
    from gpupool.providers.base import Provider
    from gpupool.server.db import Store

DEFAULT_POLICY = default_policy()


@dataclass(frozen=True, slots=True)
class _Limits:
    """What `up` bounds for the settings: request bodies, pods' logs and where they go."""

    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    max_pod_log_bytes: int = DEFAULT_MAX_POD_LOG_BYTES
    agent_dir: Path | None = None
    ha: bool = False
    serve_port: int = 0  # the services' data plane (docs/serving-dataplane.md)
    serve_host: str = DEFAULT_HOST
    serve_router: str = "auto"
    serve_cold_start_s: float = 60.0
    tenant_request_rate: str = DEFAULT_TENANT_REQUEST_RATE
    tenant_open_requests: int = DEFAULT_TENANT_OPEN_REQUESTS


def up(
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", parser=directory("--data-dir"),
                                  help="Store and admin token (default: user data dir).")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option("--port", help="Port to listen on.", min=1, max=65535)] = DEFAULT_PORT,
    simulate: Annotated[
        str, typer.Option("--simulate", help="Simulated pool: 2x8xH100, or an OpenB node CSV.")
    ] = "",
    provider: Annotated[str, typer.Option("--provider", help="local (default), fake or ray.")] = "local",
    ray_address: Annotated[
        str, typer.Option("--ray-address", envvar="GPUPOOL_RAY_ADDRESS", help=(
            "With --provider ray: the Ray cluster's HOST:PORT (default: start a Ray head here)."))
    ] = "",
    ray_pod_carrier: Annotated[
        str, typer.Option("--ray-pod-carrier", envvar="GPUPOOL_RAY_POD_CARRIER", help=(
            "With --provider ray: what carries each pod, 'group' (default: a placement group per pod, "
            "run by the node's agent) or 'actor' (an actor per pod, a Python process each; slower)."))
    ] = "",
    database_url: Annotated[
        str, typer.Option("--database-url", help=(
            "postgresql+psycopg://USER@HOST:PORT/DB (default: SQLite in DATA_DIR). A URL with a "
            "password is refused here (every user can read a command line): use --database-url-file "
            "or GPUPOOL_DATABASE_URL."))
    ] = "",
    database_url_file: Annotated[
        Path | None, typer.Option("--database-url-file", help=(
            "A file holding the database URL, password included; it must be yours and readable by "
            "you only (chmod 600). Without either flag, GPUPOOL_DATABASE_URL is used."))
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option("--policy", help=f"Placement policy: {policy_names_text()} (default: {DEFAULT_POLICY}).")
    ] = None,
    placement: Annotated[str | None, typer.Option("--placement", hidden=True)] = None,  # --policy's old name
    tls_cert: Annotated[
        Path | None, typer.Option("--tls-cert", help="Serve HTTPS with this PEM certificate (chain).")
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option("--tls-key", help="The PEM private key of --tls-cert.")
    ] = None,
    metrics_public: Annotated[
        bool, typer.Option("--metrics-public", help="Serve /metrics without a token (loopback --host only).")
    ] = False,
    config: Annotated[
        Path | None,
        typer.Option("--config", envvar="GPUPOOL_CONFIG", help=(
            "Scheduling configuration (YAML): placement, ordering, preemption, backfill, priority "
            "classes, queues, failure handling, default slice resources. See docs/configuration.md; "
            "check a file with `gpupool config check FILE`."))
    ] = None,
    max_request_body: Annotated[
        str, typer.Option("--max-request-body", envvar="GPUPOOL_MAX_REQUEST_BODY", help=(
            "Refuse request bodies above this size with 413 before reading them (remote calls and "
            "fabric telemetry keep room for their larger payloads)."))
    ] = "1MiB",
    max_pod_log: Annotated[
        str, typer.Option("--max-pod-log", envvar="GPUPOOL_MAX_POD_LOG", help=(
            "What each log of one pod may hold; beyond it the pod's output is dropped and its log "
            "ends with a line saying so."))
    ] = "1GiB",
    tenant_request_rate: Annotated[
        str, typer.Option("--tenant-request-rate", envvar="GPUPOOL_TENANT_REQUEST_RATE", help=(
            "What each tenant may send to this server's API, in requests per moving window "
            "(e.g. 100/second;3000/minute); past it a request is answered 429 with Retry-After and "
            "the gpupool client sends it again. The admin is not counted. Requests with tokens "
            "this pool does not know count the same way per client address. 'off': no bound."))
    ] = DEFAULT_TENANT_REQUEST_RATE,
    tenant_open_requests: Annotated[
        int, typer.Option("--tenant-open-requests", envvar="GPUPOOL_TENANT_OPEN_REQUESTS", min=0, help=(
            "How many requests each tenant may hold open on this server at once (followed event "
            "and log streams, long polls, execs); past it a request is answered 429. The admin "
            "is not counted. 0: no bound."))
    ] = DEFAULT_TENANT_OPEN_REQUESTS,
    agent_dir: Annotated[
        Path | None, typer.Option(
            "--agent-dir", envvar="GPUPOOL_AGENT_DIR", parser=directory("--agent-dir"), help=(
                "Pods' logs and the agents' state (default: DATA_DIR/agents); put it on another "
                "filesystem than the store so pods' output can never fill the store's disk."))
    ] = None,
    ha: Annotated[
        bool, typer.Option("--ha", help=(
            "Share the PostgreSQL store with other servers: all serve the API, the one holding the "
            "leader lease schedules, another takes over within the lease (GPUPOOL_LEASE_S, default "
            "10 s) if it dies; see docs/ha.md."))
    ] = False,
    # ---- the services' data plane (docs/serving-dataplane.md): one block
    serve_port: Annotated[int, typer.Option("--serve-port", min=0, max=65535, help=(
        "Route services' traffic on this port: http://SERVE_HOST:PORT/s/TENANT/SERVICE/ "
        "(0: not routed)."))] = 0,
    serve_host: Annotated[str, typer.Option("--serve-host", help=(
        "Address of the services' listener."))] = DEFAULT_HOST,
    serve_router: Annotated[str, typer.Option("--serve-router", help=(
        "auto (HAProxy when installed, else the in-process router), haproxy or in-process."))] = "auto",
    serve_cold_start: Annotated[float, typer.Option("--serve-cold-start", help=(
        "Seconds a request waits for a first ready replica before a 503 with Retry-After."))] = 60.0,
    fabric: Annotated[
        Path | None,
        typer.Option("--fabric", help=(
            "The IB fabric (ibnetdiscover output or a `gpupool fabric generate` file): gangs are placed "
            "by it, link failures requeue the gangs they cut off; see docs/fabric.md."))
    ] = None,
    federation: Annotated[
        Path | None,
        typer.Option("--federation", help=(
            "Serve a federation hub over the member pools this file names (URL, token file, region, "
            "prices, data sets): tenants use it as a pool, it places their work on the members; see "
            "docs/federation.md."))
    ] = None,
) -> None:
    """Start the pool: API on http://HOST:PORT/api/v1 (docs at /docs), scheduler, local agent.

    With no GPU and no --simulate it says so and serves a small, clearly labelled simulated pool.
    The admin token is written to DATA_DIR/admin-token (mode 0600) at first start, never printed.
    /metrics needs the admin token or a metrics token (gpupool token create --admin --scope metrics).

    Without --config the configuration's defaults apply (`gpupool config show` prints them);
    --policy overrides the configuration's placement.

    With --provider ray, pods run on a Ray cluster's nodes (`gpupool node join` on each GPU
    server); without --ray-address a Ray head starts here, its address printed and written to
    DATA_DIR/ray-address (see docs/scale-out.md).

    A PostgreSQL password never goes on the command line: --database-url with one is refused;
    give the URL in a 0600 file (--database-url-file) or in GPUPOOL_DATABASE_URL.

    Example: gpupool up --simulate 2x8xH100 --config pool.yaml
    """
    import os

    from gpupool.core.units import parse_size_bytes
    from gpupool.errors import GpupoolError
    from gpupool.server import dburl

    if ray_pod_carrier:
        if ray_pod_carrier not in ("group", "actor"):
            print(f"Error: --ray-pod-carrier must be group or actor, not {ray_pod_carrier!r}.",
                  file=sys.stderr)
            raise typer.Exit(2)
        os.environ["GPUPOOL_RAY_POD_CARRIER"] = ray_pod_carrier  # read by the ray provider
    if federation is not None:  # a hub: no nodes, no scheduler; the members run the work
        from gpupool.federation.serve import serve_hub

        try:
            serve_hub(federation, data_dir, host, port, dburl.resolve(database_url, database_url_file),
                      tls_cert, tls_key)
        except GpupoolError as exc:
            print(f"Error: {exc.message}", file=sys.stderr)
            raise typer.Exit(exc.exit_code) from None
        return
    try:
        if simulate:
            from gpupool.providers.nodespec import check_spec

            check_spec(simulate)  # a spec too large for memory is refused before anything starts
        # Read (and GPUPOOL_DATABASE_URL removed from this process's environment) before anything
        # is started, so no child process inherits the URL.
        database_url = dburl.resolve(database_url, database_url_file)
        limits = _Limits(max_request_body_bytes=parse_size_bytes(max_request_body, "--max-request-body"),
                         max_pod_log_bytes=parse_size_bytes(max_pod_log, "--max-pod-log"),
                         agent_dir=agent_dir, ha=ha, serve_port=serve_port, serve_host=serve_host,
                         serve_router=serve_router, serve_cold_start_s=serve_cold_start,
                         tenant_request_rate=tenant_request_rate,
                         tenant_open_requests=tenant_open_requests)
        _serve(data_dir, host, port, simulate, provider, database_url, policy or placement or "",
               tls_cert, tls_key, metrics_public, config, fabric_path=fabric, ray_address=ray_address,
               limits=limits)
    except GpupoolError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None


def _serve(data_dir: Path | None, host: str, port: int, simulate: str, provider: str, database_url: str,
           placement: str, tls_cert: Path | None = None, tls_key: Path | None = None,
           metrics_public: bool = False, config_path: Path | None = None,
           fabric_path: Path | None = None, ray_address: str = "", limits: _Limits | None = None) -> None:
    import logging

    from gpupool.server.settings import Settings, default_data_dir, is_loopback

    settings = Settings(data_dir=data_dir or default_data_dir(), host=host, port=port, simulate=simulate,
                        provider=provider, database_url=database_url, placement=placement,
                        tls_cert=tls_cert, tls_key=tls_key, metrics_public=metrics_public,
                        **asdict(limits or _Limits())).with_env()
    from gpupool.config import load_config

    pool_config = load_config(config_path)  # a bad file stops here, one sentence per problem
    if settings.placement:
        check_policy(settings.placement)  # an unknown name stops here, with a suggestion
    _check_tls_pair(settings.tls_cert, settings.tls_key)
    if settings.tls_cert is None and not is_loopback(host):
        print(f"Warning: {host} is reachable from other machines and TLS is off, so tokens travel in clear; "
              "serve HTTPS with --tls-cert and --tls-key.", file=sys.stderr, flush=True)
    # The server's modules (a second of CPU to import) only once the options above were accepted: a
    # bad file, policy or certificate is refused without them, and all of them are in place before
    # anything is made (as secure_data_dir's umask).
    from dataclasses import replace

    import uvicorn

    from gpupool.server.app import create_app
    from gpupool.server.backup import hold_server_lock
    from gpupool.server.connguard import guarded_protocol
    from gpupool.server.datadir import pod_accounts_notice, pool_id, secure_data_dir
    from gpupool.server.db import Store
    from gpupool.server.provision import provision
    from gpupool.server.runtime import Runtime
    from gpupool.server.services.tenants import bootstrap

    secure_data_dir(settings.data_dir)
    # before anything runs on it (a stale data plane stopped, the node agent opened): one server's
    hold_server_lock(settings.data_dir, shared=settings.ha)
    settings = replace(settings, pool_id=pool_id(settings.data_dir))
    if settings.agent_dir is not None:
        secure_data_dir(settings.agent_dir, flag="--agent-dir")
    else:
        settings.resolved_agent_dir.mkdir(exist_ok=True, mode=0o700)
    # the pods' records: another server's agent on them would adopt this one's pods
    hold_server_lock(settings.resolved_agent_dir, shared=settings.ha,
                     flag="--data-dir" if settings.agent_dir is None else "--agent-dir")
    _check_port(host, port)
    low = raise_open_files_limit()
    if low:
        print(low, file=sys.stderr, flush=True)
    if settings.serve_port:
        from gpupool.server.dataplane.haproxy import stop_stale

        stop_stale(settings.data_dir / "dataplane")  # left running by a run that was killed
        _check_port(settings.serve_host, settings.serve_port, flag="--serve-port", host_flag="--serve-host")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    provisioned = provision(settings, ray_address=ray_address)
    if provisioned.notice:
        print(provisioned.notice, flush=True)
    if provisioned.pool_id is not None:  # the Ray cluster's, another server's: its pods' accounts
        print(f"Note: the Ray cluster's pool id is {provisioned.pool_id} (published by the server that "
              f"connected to it first), not this data directory's {settings.pool_id}: the pool's pods run "
              f"as gpupool-{provisioned.pool_id}-<tenant>.", flush=True)
        # the accounts this server checks tenants' mappings against are the pods'; its image store
        # stays where this data directory's id put it
        settings = replace(settings, pool_id=provisioned.pool_id, image_dir=settings.resolved_image_dir)
    from gpupool.providers.base import Capability

    missing = provisioned.provider.missing_capabilities()
    accounts = pod_accounts_notice(Capability.REAL_PROCESSES not in missing, settings.pool_id)
    if accounts:
        print(accounts, flush=True)
    if accounts and Capability.USER_ISOLATION not in missing:
        visible = provisioned.provider.missing_capabilities().get(Capability.HIDDEN_PROCESSES)
        if visible:  # read again: the pods' group exists now, so an exemption of it is seen
            print(f"Warning: {visible} (gpupool node ls, layer proc).", file=sys.stderr, flush=True)
        shared = missing.get(Capability.NETWORK_ISOLATION)
        if shared:
            print(f"Warning: {shared} (gpupool node ls, layer network).", file=sys.stderr, flush=True)
    store = Store.open(settings.resolved_database_url)
    from gpupool.server.services.netblocks import StoreBlocks

    provisioned.provider.use_network_blocks(StoreBlocks(store))  # each Ray machine's block, stored
    rt = Runtime(settings=settings, store=store, provider=provisioned.provider, config=pool_config)
    if fabric_path is not None:
        from gpupool.server.services.fabric import open_live_fabric

        rt.fabric = open_live_fabric(fabric_path, rt.nodes())  # a fabric too small for the pool stops here
        print(rt.fabric.summary(len(rt.nodes())), flush=True)
    print(_scheduling_line(pool_config, settings.placement, config_path), flush=True)
    for note in pool_config.notes():
        print(f"Note: {note}", flush=True)
    token = bootstrap(rt)
    from gpupool.server.services.audit import record_unenforced_layers

    record_unenforced_layers(rt)  # `gpupool audit` keeps which isolation layers this run lacked
    _announce_token(settings.admin_token_path, token)
    print(f"gpupool is serving on {settings.scheme}://{host}:{port} (dashboard at /, API docs at /docs); "
          "stop with Ctrl-C.",
          flush=True)
    from gpupool import gc_tuning

    gc_tuning.tune()  # a long-lived heap: see gpupool/gc_tuning.py
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again with the handler it
    # found: make that an exit through the `finally` below, so the provider is closed (the agents'
    # spare pod namespaces removed, their threads stopped) as on Ctrl-C, with the status of SIGTERM.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    leadership = None
    if settings.ha:
        from gpupool.server.leader import Leadership, bound_stalled_transactions

        bound_stalled_transactions(store, settings.lease_s * 2 / 3)  # a stopped leader's transaction
        leadership = Leadership(store, address=f"{host}:{port}", lease_s=settings.lease_s,
                                renew_s=settings.lease_renew_s)
        print(f"High availability: server {leadership.server_id} schedules only while it holds the "
              f"leader lease ({settings.lease_s:g} s, renewed every {settings.lease_renew_s:g} s).",
              flush=True)
    try:
        app = create_app(rt, leadership=leadership, reopen_provider=(
            (lambda: _with_blocks(provision(settings, ray_address=ray_address).provider, store))
            if settings.ha else None))
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                               access_log=False, ssl_certfile=settings.tls_cert,
                                               ssl_keyfile=settings.tls_key, http=guarded_protocol()))
        app.state.stopping = lambda: server.should_exit  # open event streams end, so shutdown waits for none
        server.run()
        if not server.started:
            sys.exit(3)  # uvicorn.run's STARTUP_FAILURE: the port was taken, the certificate unreadable
    finally:
        rt.provider.close()  # the one opened at the last takeover, with several servers
        store.close()


def _with_blocks(provider: Provider, store: Store) -> Provider:
    """A provider reopened at a takeover hands out machines' pod network blocks from the store."""
    from gpupool.server.services.netblocks import StoreBlocks

    provider.use_network_blocks(StoreBlocks(store))
    return provider


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _scheduling_line(config: PoolConfig, placement: str, path: Path | None) -> str:
    """'Scheduling: placement fgd-strand, ordering drf, preemption on (scope queue), backfill on (from
    FILE).'"""
    s = config.scheduling
    source = f"from {path}" if path is not None else "the defaults; see gpupool config show"
    preemption = f"on (scope {config.preemption.scope})" if s.preemption else "off"
    return (f"Scheduling: placement {placement or s.placement}, ordering {s.ordering}, preemption "
            f"{preemption}, backfill {'on' if s.backfill else 'off'} ({source}).")


OPEN_FILES_WANTED = 8192
"""Below this many open files the server warns: each open request, pod log and store connection
takes one, and tenants may each hold `--tenant-open-requests` requests open."""


def raise_open_files_limit() -> str:
    """Raise this process's soft limit of open files to its hard limit, as servers do: the soft
    limit is often 1024, which a few tenants' followed streams would use up, and then the server
    could accept no connection and open no file for anyone. Returns a warning when even the hard
    limit is below OPEN_FILES_WANTED, else ''."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:  # the kernel still caps it (fs.nr_open)
        try:
            target = int(Path("/proc/sys/fs/nr_open").read_text())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < OPEN_FILES_WANTED:
        return (f"Warning: this server may hold only {soft} files open (its hard limit); each open "
                "request, pod log and store connection takes one. Raise it (ulimit -Hn as root, "
                "LimitNOFILE= in a systemd unit) to at least 8192.")
    return ""


def _check_port(host: str, port: int, flag: str = "--port", host_flag: str = "--host") -> None:
    """The address can be listened on; else one sentence blaming what is wrong: the address (not
    this machine's, or a name that does not resolve) or the port (taken, or privileged)."""
    import errno

    from gpupool.errors import InvalidInput

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except socket.gaierror as exc:  # a name that resolves to no address
            raise InvalidInput(
                f"Cannot listen on {host}:{port}: {host} is not a name this machine can resolve "
                f"({exc.strerror}); give {host_flag} 127.0.0.1 (this machine only), 0.0.0.0 (all its "
                "addresses) or one of this machine's own addresses."
            ) from None
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise InvalidInput(
                    f"Cannot listen on {host}:{port}: {host} is not an address of this machine; give "
                    f"{host_flag} 127.0.0.1 (this machine only), 0.0.0.0 (all its addresses) or one of "
                    "this machine's own addresses."
                ) from None
            raise InvalidInput(
                f"Cannot listen on {host}:{port} ({exc.strerror}); pick another {flag}."
            ) from None


def _check_tls_pair(cert: Path | None, key: Path | None) -> None:
    """The certificate and key load together (else one sentence, before anything starts)."""
    import ssl

    from gpupool.errors import InvalidInput

    if cert is None or key is None:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=lambda: b"")  # an encrypted key fails, never prompts
    except (ssl.SSLError, OSError) as exc:
        raise InvalidInput(
            f"--tls-cert {str(cert)!r} with --tls-key {str(key)!r} cannot serve HTTPS "
            f"({getattr(exc, 'reason', None) or exc}); give a PEM certificate and its unencrypted "
            "private key."
        ) from None


def _announce_token(path: Path, token: str | None) -> None:
    """Say where the admin token is; the token itself goes to no terminal and no log."""
    made = "created now" if token is not None else "created at first start"
    print(f"Admin token: in {path} (mode 0600, {made}).", flush=True)
