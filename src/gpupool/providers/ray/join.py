"""Join a machine to the pool: probe its devices, start its Ray worker node, start its node agent.

What `gpupool node join` runs on each GPU server, and what the provider runs for each simulated
node. The caller must be connected to the cluster (driver.connect). The node is schedulable as soon
as Ray has registered it: the joiner publishes the description it probed (Ray's internal KV, by
Ray node id), so the server lists the node without waiting for the agent actor's Python process to
start (about a second); pods launched meanwhile queue behind the agent's start. The server publishes
the pool's id there too when it connects (`claim_pool_id`), and a joiner reads it
(`published_pool_id`) into its node's config, so the node's pods run as the pool's accounts.
"""

from __future__ import annotations

import pickle
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray.experimental.internal_kv
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from gpupool.agent.identity import POOL_ID
from gpupool.errors import Conflict, ProviderError
from gpupool.providers.local import LocalProvider
from gpupool.providers.ray.cluster import OBJECT_STORE_BYTES_SIMULATED, RayProcess, start_worker
from gpupool.providers.ray.membership import ray_node_table
from gpupool.providers.ray.node_agent import NodeAgentActor, NodeDescription
from gpupool.providers.ray.nodeconfig import NodeConfig, node_agent_name
from gpupool.providers.ray.resources import node_resources
from gpupool.providers.ray.settings import NAMESPACE, NODE_LABEL, SIMULATED_NODE_ENV

DESCRIPTION_KEY = "gpupool-node-{node_id}"
"""The internal KV key of the description a joiner probed, in the gpupool namespace."""
POOL_ID_KEY = "gpupool-pool-id"
"""The internal KV key of the pool's id (its pods' accounts are `gpupool-<pool id>-<tenant>`), in the
gpupool namespace: the Ray cluster is the pool, so every node of it names accounts by one id."""

JOIN_TIMEOUT_S = 60.0


@dataclass
class JoinedNode:
    """A node this process started: its Ray worker process and its agent."""

    config: NodeConfig
    process: RayProcess
    node_id: str
    agent: Any
    description: NodeDescription
    """As probed by the joiner (the agent's own answers come later, through the membership)."""

    def agent_ready(self, timeout_s: float = JOIN_TIMEOUT_S) -> NodeDescription:
        """Block until the node agent answers; ProviderError when it does not in time."""
        try:
            description: NodeDescription = ray.get(self.agent.describe.remote(), timeout=timeout_s)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            raise ProviderError(f"The agent of node {self.config.name} did not start "
                                f"({type(exc).__name__}); see {self.process.temp_dir}.") from None
        return description


def probe(config: NodeConfig) -> NodeDescription:
    """The node as the agent sees it here: NVML devices (or the simulated ones), IB ports."""
    local = LocalProvider(config.agent_dir(), simulate=config.simulate or None, node_name=config.name,
                          ib_sysfs_root=config.ib_sysfs_root, scratch_root=config.scratch(),
                          identities=config.identities())
    try:
        return NodeDescription(node=local.nodes()[0], config=config, missing=local.missing_capabilities(),
                               hostname=socket.gethostname())
    finally:
        local.close()


def publish_description(node_id: str, description: NodeDescription) -> None:
    ray.experimental.internal_kv._internal_kv_put(DESCRIPTION_KEY.format(node_id=node_id),
                                                  pickle.dumps(description), namespace=NAMESPACE)


def published_description(node_id: str) -> NodeDescription | None:
    """What the joiner of Ray node `node_id` probed, if it published it."""
    raw = ray.experimental.internal_kv._internal_kv_get(DESCRIPTION_KEY.format(node_id=node_id),
                                                        namespace=NAMESPACE)
    if not raw:
        return None
    description = pickle.loads(raw)
    return description if isinstance(description, NodeDescription) else None


def forget_description(node_id: str) -> None:
    ray.experimental.internal_kv._internal_kv_del(DESCRIPTION_KEY.format(node_id=node_id),
                                                  namespace=NAMESPACE)


def claim_pool_id(pool_id: str) -> str:
    """Publish `pool_id` as the cluster's pool id unless one is already published, and return the
    cluster's: the first server to connect names the accounts of every node of the pool, so the
    servers of one pool (several, with high availability, each with its own data directory and so
    its own id) never run one tenant's pods as two accounts. '' publishes nothing."""
    if pool_id:
        ray.experimental.internal_kv._internal_kv_put(POOL_ID_KEY, pool_id.encode(), overwrite=False,
                                                      namespace=NAMESPACE)
    return published_pool_id()


def published_pool_id() -> str:
    """The cluster's pool id ('' where none was published: a cluster of a server from before pools
    had ids, whose pods run as `gpupool-<tenant>`). Raises ProviderError for a value that is not a
    pool id."""
    raw = ray.experimental.internal_kv._internal_kv_get(POOL_ID_KEY, namespace=NAMESPACE)
    if not raw:
        return ""
    text = raw.decode(errors="replace")
    if not POOL_ID.match(text):
        raise ProviderError(f"The Ray cluster's pool id ({POOL_ID_KEY} in Ray's internal KV, namespace "
                            f"{NAMESPACE}) is {text[:40]!r}, not a pool id (4 to 8 lowercase letters and "
                            "digits).")
    return text


def _wait_for_ray_node(name: str, process: RayProcess, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        node = ray_node_table().get(name)
        if node is not None and node.alive:
            return node.node_id
        if not process.alive():
            raise ProviderError(f"The Ray worker node for {name} exited; see {process.log_path}.")
        time.sleep(0.1)
    raise ProviderError(f"Node {name} did not appear in the Ray cluster within {timeout_s:.0f} s.")


def _replace_agent(name: str) -> None:
    """Remove a previous agent of this node name (its Ray node is gone), so the name is free."""
    try:
        old = ray.get_actor(node_agent_name(name), namespace=NAMESPACE)
    except ValueError:
        return
    ray.kill(old, no_restart=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            ray.get_actor(node_agent_name(name), namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.1)


def start_node(address: str, token_path: Path, config: NodeConfig, *, node_ip: str | None = None,
               num_cpus: int | None = None, simulated: bool = False,
               timeout_s: float = JOIN_TIMEOUT_S) -> JoinedNode:
    """Start this machine's Ray worker node for `config` and ask for its node agent; blocks until Ray
    has registered the node (the agent starts in the background: `agent_ready` waits for it).
    Raises Conflict when a live node already has that name."""
    existing = ray_node_table().get(config.name)
    if existing is not None and existing.alive:
        raise Conflict(f"A node named {config.name!r} is already in the pool; choose another with --name.")
    description = probe(config)
    process = start_worker(address, token_path, resources=node_resources(description.node),
                           labels={NODE_LABEL: config.name}, node_ip=node_ip,
                           num_cpus=0 if simulated else num_cpus,
                           object_store_bytes=OBJECT_STORE_BYTES_SIMULATED if simulated else None,
                           extra_env=SIMULATED_NODE_ENV if simulated else None)
    try:
        node_id = _wait_for_ray_node(config.name, process, timeout_s)
        _replace_agent(config.name)
        agent = NodeAgentActor.options(  # type: ignore[attr-defined]
            name=node_agent_name(config.name), namespace=NAMESPACE, lifetime="detached",
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(config)
        publish_description(node_id, description)
    except BaseException:
        process.stop(grace_s=2)
        raise
    return JoinedNode(config, process, node_id, agent, description)
