"""How gpupool's Ray processes are configured: version pin, namespace, token, environment.

Every Ray process gpupool starts (head, worker nodes, the server's driver) runs with:
- RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH: the cluster's token, kept 0600 in the data dir;
- RAY_memory_monitor_refresh_ms=0: Ray's memory monitor would kill a node agent or pod actor (and so pods)
  when the machine runs low on memory, and report it only in Ray's logs; gpupool enforces host
  memory itself (cgroup or RLIMIT), so the monitor is off;
- RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1: Ray must not set CUDA_VISIBLE_DEVICES for the
  actors (the nodes advertise no Ray GPUs); the agent sets the pod's own from its slice;
- RAY_task_events_report_interval_ms=0: gpupool asks every busy node's agent for its pods' statuses
  many times a second; Ray would record each of those calls as a task event in the GCS (the source of
  `ray list tasks` and the dashboard's task view), a cost on every process for a record nobody reads:
  gpupool reports its pods itself.
Simulated nodes (many on one machine, `--simulate`) report less often (SIMULATED_NODE_ENV): Ray's
metrics and the dashboard agent's machine statistics once a minute instead of every few seconds, and
their raylets' resource views once a second instead of every 100 ms (each report goes to every other
raylet, all on the same machine: a placement group's create and remove cost sixteen simulated
raylets 12 ms of CPU, 6.7 ms at one report a second; the GCS places groups from its own accounting,
which it updates at once). A real node keeps Ray's defaults.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from gpupool.errors import ProviderError

RAY_VERSION = "2.60.0"
"""The Ray release the provider is built and tested against (`pip install 'gpupool[ray]'`)."""
NAMESPACE = "gpupool"
NODE_LABEL = "gpupool.io/node"
"""The Ray node label whose value is the gpupool node name (how the server matches the nodes)."""
TOKEN_FILE = "ray-token"
ADDRESS_FILE = "ray-address"
RAY_PROCESS_ENV = {
    "RAY_AUTH_MODE": "token",
    "RAY_memory_monitor_refresh_ms": "0",
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_task_events_report_interval_ms": "0",
}
SIMULATED_NODE_ENV = {
    "RAY_metrics_report_interval_ms": "60000",
    "REPORTER_UPDATE_INTERVAL_MS": "60000",
    "RAY_event_stats": "0",
    "RAY_raylet_report_resources_period_milliseconds": "1000",
}


def check_version(version: str) -> None:
    """Refuse a Ray release other than the pinned one (its scheduling and auth differ)."""
    if version != RAY_VERSION:
        raise ProviderError(f"The ray provider needs Ray {RAY_VERSION}, but Ray {version} is installed; "
                            f"run pip install 'ray[default]=={RAY_VERSION}' (or 'gpupool[ray]').")


def ensure_token(path: Path) -> Path:
    """The cluster token file at `path`, created (256 random bits, mode 0600) when missing. Refuses
    a token file that others can read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        fd = -1
    if fd < 0:
        if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ProviderError(f"The Ray token file {path} is readable by other users; "
                                f"run chmod 600 {path}.")
        if not path.read_text().strip():
            raise ProviderError(f"The Ray token file {path} is empty; delete it to have a new one made.")
        return path
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32))
    return path


def ray_env(token_path: Path) -> dict[str, str]:
    """The variables every gpupool Ray process (and the server's Ray driver) runs with."""
    return {**RAY_PROCESS_ENV, "RAY_AUTH_TOKEN_PATH": str(token_path)}
POD_CARRIER_ENV = "GPUPOOL_RAY_POD_CARRIER"
"""The pod carrier a RayProvider uses when none is given: group (default) or actor."""
