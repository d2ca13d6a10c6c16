"""Run one Ray worker node in this process: what `ray start --address ... --block` does for a worker.

Ray's command line imports all of Ray's CLI (click, the autoscaler, the job SDK...) before it
starts anything: about 1.5 s of CPU, paid by every node that joins. This module builds the same
node (Ray's RayParams and Node, as `ray start` does) from the few options gpupool uses, prints
Ray's "Ray runtime started." line, and serves until its group is terminated. It runs in a process
group of its own (cluster.RayProcess), so stopping the group stops every process of the node.

    python -m gpupool.providers.ray.worker_node --address HOST:PORT --temp-dir DIR --resources JSON
        --labels JSON [--node-ip-address IP] [--num-cpus N] [--object-store-memory BYTES] --ports JSON
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

EXPECTED_EXITS = (0, 15, -15, 128 + 15)
"""Exit codes of the node's processes that are a stop, not a failure (SIGTERM)."""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpupool-ray-worker-node")
    parser.add_argument("--address", required=True)
    parser.add_argument("--temp-dir", required=True)
    parser.add_argument("--resources", default="{}")
    parser.add_argument("--labels", default="{}")
    parser.add_argument("--node-ip-address", default="")
    parser.add_argument("--num-cpus", type=int, default=None)
    parser.add_argument("--object-store-memory", type=int, default=None)
    parser.add_argument("--ports", default="{}", help="dashboard_agent_listen_port, metrics_agent_port, "
                                                     "metrics_export_port, runtime_env_agent_port")
    parser.add_argument("--parent-pid", type=int, default=0,
                        help="Stop the node once this process (the one that started it) is gone.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    from ray._private import services
    from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    ports = {k: int(v) for k, v in json.loads(args.ports).items()}
    node_ip = services.resolve_ip_for_localhost(args.node_ip_address) if args.node_ip_address else None
    params = RayParams(node_ip_address=node_ip, node_name=node_ip, min_worker_port=0, max_worker_port=0,
                       num_cpus=args.num_cpus, num_gpus=0, resources=json.loads(args.resources),
                       labels=json.loads(args.labels), temp_dir=args.temp_dir,
                       object_store_memory=args.object_store_memory,
                       include_log_monitor=False,  # type: ignore[arg-type]  # a bool, as ray start passes
                       dashboard_agent_listen_port=ports.get("dashboard_agent_listen_port"),
                       metrics_agent_port=ports.get("metrics_agent_port"),
                       metrics_export_port=ports.get("metrics_export_port"),
                       runtime_env_agent_port=ports.get("runtime_env_agent_port"))
    address = services.canonicalize_bootstrap_address(args.address, temp_dir=args.temp_dir)
    if address is None:
        sys.exit(f"Cannot read the Ray address {args.address!r}.")
    params.gcs_address = address
    params.update_if_absent(node_ip_address=services.get_node_ip_address(address))
    ensure_token_if_auth_enabled(None, create_token_if_missing=False)
    node = Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True, connect_only=False)
    print("Ray runtime started.", flush=True)
    while True:
        time.sleep(1)
        failed = [(kind, proc.returncode) for kind, proc in node.dead_processes()
                  if proc.returncode not in EXPECTED_EXITS]
        if failed:
            print(f"Ray processes exited: {failed}", flush=True)
            node.kill_all_processes(check_alive=False, allow_graceful=False)
            os._exit(1)
        if args.parent_pid and os.getppid() != args.parent_pid:
            print("The process that started this node is gone; stopping.", flush=True)
            node.kill_all_processes(check_alive=False, allow_graceful=True)
            os._exit(0)


if __name__ == "__main__":
    main()
