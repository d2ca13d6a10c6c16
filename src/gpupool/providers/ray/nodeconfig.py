"""What a gpupool node on Ray is, as its actors need it: name, devices spec, where its files live,
and the pool id its pods' accounts are named by."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpupool.agent.identity import Identities
from gpupool.agent.probes.infiniband import SYSFS_ROOT

POD_ACTOR_PREFIX = "pod-"
NODE_AGENT_PREFIX = "node-"


def pod_actor_name(pod_id: str) -> str:
    return POD_ACTOR_PREFIX + pod_id


def node_agent_name(node: str) -> str:
    return NODE_AGENT_PREFIX + node


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """One gpupool node as its Ray actors build it: the same on every actor of the node."""

    name: str
    state_dir: str
    """The node's directory on its machine: node/ (the node agent), pods/<pod_id>/ (each pod's)."""
    simulate: str = ""
    """Simulated devices ('8xH100'), '' for the machine's real ones (NVML)."""
    ib_sysfs_root: str = str(SYSFS_ROOT)
    scratch_root: str = ""
    """The pods' private directories and checkpoint directories ('' = the agent's default)."""
    pool_id: str = ""
    """The pool's id, the Ray cluster's (join.py, `claim_pool_id`): the node's pods run as
    `gpupool-<pool id>-<tenant>`, as a local pool's do; '' (a cluster whose server published none)
    names them `gpupool-<tenant>`."""

    def agent_dir(self) -> Path:
        return Path(self.state_dir) / "node"

    def pod_dir(self, pod_id: str) -> Path:
        return Path(self.state_dir) / "pods" / pod_id

    def pod_record(self, pod_id: str) -> Path:
        """Where an actor-carried pod's record lives (its actor's runner's state file)."""
        return self.pod_dir(pod_id) / "pods" / pod_id / "state.json"

    def scratch(self) -> Path | None:
        return Path(self.scratch_root) if self.scratch_root else None

    def identities(self) -> Identities:
        """The pods' accounts on this node: the pool's own, named by its id."""
        return Identities(pool_id=self.pool_id)
