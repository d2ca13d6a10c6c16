"""`gpupool node join` / `gpupool node leave`: add this machine to a pool on Ray, and take it out.

join probes the devices (NVML, or --simulate), starts a Ray worker node that advertises no Ray
GPUs but one custom resource per device for compute and memory and the gpupool node label, starts
the node's agent actor, and serves until stopped. leave drains the node through the server (when
one is named) and stops the join, which stops the Ray worker node.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gpupool.cli._common import reports_errors
from gpupool.errors import InvalidInput, NotFound, ProviderError

JOIN_FILE = "join.json"
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
SCHEDULABLE_TIMEOUT_S = 60.0
LEAVE_TIMEOUT_S = 60.0


def _default_state_dir(name: str) -> Path:
    import platformdirs

    return Path(platformdirs.user_state_dir("gpupool")) / "ray-nodes" / name


def _default_token_file() -> Path:
    from gpupool.providers.ray.settings import TOKEN_FILE
    from gpupool.server.settings import default_data_dir

    return default_data_dir() / TOKEN_FILE


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidInput(f"Node name {name!r} must be 1-63 letters, digits, '.', '_' or '-', starting and "
                           "ending with a letter or digit; choose one with --name.")
    return name


def _check_token(path: Path) -> Path:
    if not path.is_file():
        raise InvalidInput(f"No Ray token at {path}; copy the head's DATA_DIR/ray-token here (mode 0600) or "
                           "give its path with --ray-token-file.")
    if path.stat().st_mode & 0o077:  # the server refuses such a file for the same reason
        raise InvalidInput(f"The Ray token file {path} is readable or writable by other users, tenants' pods "
                           f"included, and it lets its holder run code on every node; run chmod 600 {path}.")
    return path


def _wait_schedulable(server: str, name: str, started_s: float) -> None:
    """Wait until the server lists the node (it is then schedulable), and say how long it took."""
    from gpupool.client import Client

    with Client(server) as pool:
        deadline = time.monotonic() + SCHEDULABLE_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                pool.node(name)
            except NotFound:
                time.sleep(0.2)
                continue
            print(f"The pool at {server} lists node {name}: schedulable {time.monotonic() - started_s:.1f} s "
                  "after the join started.", flush=True)
            return
    print(f"Warning: the pool at {server} does not list node {name} after {SCHEDULABLE_TIMEOUT_S:.0f} s; "
          "is its server on the same Ray cluster (gpupool up --provider ray --ray-address ...)?",
          file=sys.stderr, flush=True)


def join(
    ray_address: Annotated[str, typer.Option("--ray-address", envvar="GPUPOOL_RAY_ADDRESS", help=(
        "The pool's Ray cluster, HOST:PORT (printed by `gpupool up --provider ray`)."))],
    server: Annotated[str, typer.Option("--server", envvar="GPUPOOL_URL", help=(
        "The pool's URL: wait until it lists this node (token from GPUPOOL_TOKEN)."))] = "",
    simulate: Annotated[str, typer.Option("--simulate", help=(
        "Simulated devices for a machine without GPUs, e.g. 8xH100."))] = "",
    name: Annotated[str, typer.Option("--name", help="The node's pool name (default: hostname).")] = "",
    token_file: Annotated[Path | None, typer.Option("--ray-token-file", help=(
        "The cluster's Ray token (default: DATA_DIR/ray-token; copy it from the head)."))] = None,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help=(
        "The node's pod files (default: the user state dir's ray-nodes/NAME)."))] = None,
    num_cpus: Annotated[int | None, typer.Option("--num-cpus", help=(
        "CPUs the Ray worker node offers to other Ray work (gpupool's pods ask for none)."))] = None,
) -> None:
    """Join this machine to a pool on Ray and serve its devices until stopped (Ctrl-C or
    `gpupool node leave`).

    Example: gpupool node join --server https://pool:8765 --ray-address 10.0.0.1:6379
    """
    reports_errors(_join)(ray_address, server, simulate, name, token_file, state_dir, num_cpus)


def _join(ray_address: str, server: str, simulate: str, name: str, token_file: Path | None,
          state_dir: Path | None, num_cpus: int | None) -> None:
    started = time.monotonic()
    name = _check_name(name or socket.gethostname().split(".")[0])
    token = _check_token(token_file or _default_token_file())
    directory = state_dir or _default_state_dir(name)
    from gpupool.providers.ray import driver
    from gpupool.providers.ray.join import published_pool_id, start_node
    from gpupool.providers.ray.nodeconfig import NodeConfig

    driver.connect(ray_address, token)
    # the pool's id, as its server published it: the node's pods run as the pool's accounts
    config = NodeConfig(name=name, state_dir=str(directory), simulate=simulate, pool_id=published_pool_id())
    if not config.pool_id:
        print("Warning: the Ray cluster has no pool id (its server is older than pool ids, or has not "
              "connected yet), so this node's pods run as gpupool-<tenant>; join again once the server "
              "runs for them to run as the pool's own accounts.", file=sys.stderr, flush=True)
    joined = start_node(ray_address, token, config, num_cpus=num_cpus)
    record = directory / JOIN_FILE
    try:
        record.write_text(json.dumps({"pid": os.getpid(), "name": name, "ray_address": ray_address,
                                      "node_id": joined.node_id}))
        devices = joined.description.node.devices
        kind = "simulated " if simulate else ""
        print(f"Node {name} joined the Ray cluster at {ray_address} with {len(devices)} {kind}device(s) "
              f"({', '.join(sorted({d.model for d in devices})) or 'none'}); stop with Ctrl-C or "
              f"`gpupool node leave --name {name}`.", flush=True)
        if server:
            _wait_schedulable(server, name, started)
        joined.agent_ready()
        _serve_until_stopped(joined.process)
    finally:
        _leave_cluster(joined)
        record.unlink(missing_ok=True)
        driver.disconnect()


def _serve_until_stopped(process: Any) -> None:
    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        while process.alive():
            time.sleep(0.5)
    except KeyboardInterrupt:
        return
    raise ProviderError(f"The Ray worker node exited; see {process.log_path}.")


def _leave_cluster(joined: Any) -> None:
    import contextlib

    import ray

    from gpupool.providers.ray.join import forget_description

    with contextlib.suppress(Exception):
        ray.kill(joined.agent, no_restart=True)  # frees the agent's name for the next join
    with contextlib.suppress(Exception):
        forget_description(joined.node_id)
    joined.process.stop()
    print(f"Node {joined.config.name} left the Ray cluster.", flush=True)


def leave(
    name: Annotated[str, typer.Option("--name", help="The node's name (default: hostname).")] = "",
    server: Annotated[str, typer.Option("--server", envvar="GPUPOOL_URL", help=(
        "The pool's URL: drain the node there first (token from GPUPOOL_TOKEN)."))] = "",
    now: Annotated[bool, typer.Option("--now", help="Requeue the node's work now; do not wait.")] = False,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help="As given to node join.")] = None,
) -> None:
    """Take this machine's node out of the pool: drain it (with --server), then stop its join.

    Example: gpupool node leave --server https://pool:8765
    """
    reports_errors(_leave)(name, server, now, state_dir)


def _leave(name: str, server: str, now: bool, state_dir: Path | None) -> None:
    name = _check_name(name or socket.gethostname().split(".")[0])
    record = (state_dir or _default_state_dir(name)) / JOIN_FILE
    try:
        pid = int(json.loads(record.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        raise NotFound(f"Node {name} is not joined from this machine (no {record}); "
                       "give --name or --state-dir as given to `gpupool node join`.") from None
    if server:
        _drain(server, name, now)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        record.unlink(missing_ok=True)
        print(f"Node {name}'s join had already stopped.")
        return
    deadline = time.monotonic() + LEAVE_TIMEOUT_S
    while record.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"Node {name} left the pool." if not record.exists() else
          f"Node {name}'s join (pid {pid}) is still stopping; check it with ps.")


def _drain(server: str, name: str, now: bool) -> None:
    """Drain the node and wait until nothing runs there (or, with `now`, until it was requeued)."""
    from gpupool.client import Client

    with Client(server) as pool:
        node = pool.drain(name, now=now)
        print(f"Draining node {name} at {server}...", flush=True)
        while node.state == "draining":
            time.sleep(1.0)
            node = pool.node(name)
