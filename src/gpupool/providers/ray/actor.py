"""The pod actor: one detached Ray actor per pod, holding its slices' resources and running it.

The actor runs the pod with the agent's code (a LocalProvider of its own, on the pod's directory of
its node): the environment built from scratch (visible devices by UUID, MPS limits, framework caps,
the tenant's Unix account when the node runs as root), the command a child process in its own
process group, its logs in files, its exit code recorded; stop is SIGTERM, a grace, then SIGKILL of
the whole group. Construction never raises: a pod that cannot start is reported FAILED with why.

Its network namespace is one of the node's pod network, lent by the node's agent (NodeAgentActor.
lend_network: the node's block, its tenant's and gang's rules, the other machines told before the pod
starts), as the group carrier's pods get theirs: the rank-0 pod of a gang holds the MASTER_ADDR the
server computed from the block. The agent takes it back when the pod's record says it ended (the
actor tells it at once; a record the agent reads says so too, should the actor be gone). Where the
agent does not answer, the pod is not started.
"""

from __future__ import annotations

import contextlib
from typing import Any

import ray

from gpupool.agent.fencing import EpochFence
from gpupool.agent.mps import MpsDaemon
from gpupool.agent.netns import PodNet
from gpupool.errors import GpupoolError, ProviderError
from gpupool.pods import LogChunk, PodLaunch, PodPhase, PodStatus
from gpupool.providers.local import LocalProvider
from gpupool.providers.ray.nodeconfig import NodeConfig, node_agent_name
from gpupool.providers.ray.settings import NAMESPACE

LEND_TIMEOUT_S = 60.0
"""The longest a pod actor waits for its node's agent to lend the pod its namespace (the agent tells
the other machines before it answers; a namespace lent after the actor gave up goes after
agent/node.py's LENT_GRACE_S)."""


class NodeNetwork:
    """The pod's namespace from its node's agent (agent/node.py's NetworkLender)."""

    def __init__(self, node: str) -> None:
        self.node = node

    def lend(self, pod: PodLaunch, url: str) -> tuple[PodNet | None, str, str]:
        try:
            agent = ray.get_actor(node_agent_name(self.node), namespace=NAMESPACE)
            lent: Any = ray.get(agent.lend_network.remote(pod, url), timeout=LEND_TIMEOUT_S)
        except (ValueError, ray.exceptions.RayError, TimeoutError) as exc:
            raise ProviderError(f"node {self.node}'s agent did not give the pod its network namespace "
                                f"({type(exc).__name__}); the pod was not started") from None
        net, pod_url, detail = lent
        return net, pod_url, detail

    def give_back(self, pod_id: str) -> None:
        with contextlib.suppress(ValueError, ray.exceptions.RayError):
            ray.get_actor(node_agent_name(self.node), namespace=NAMESPACE).return_network.remote(pod_id)


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class PodActor:
    """Runs one pod on the node it was pinned to; every method returns promptly."""

    def __init__(self, pod: PodLaunch, config: NodeConfig) -> None:
        self.pod_id, self.node = pod.pod_id, config.name
        self.error = ""
        self.local: LocalProvider | None = None
        try:
            self.local = LocalProvider(config.pod_dir(pod.pod_id), simulate=config.simulate or None,
                                       node_name=config.name, ib_sysfs_root=config.ib_sysfs_root,
                                       scratch_root=config.scratch(), mps=MpsDaemon(config.agent_dir()),
                                       identities=config.identities())
            self.local.agent.lender = NodeNetwork(config.name)
            # A leader's launch: fenced by the node's epoch (its agent's fence, node_agent.py), held
            # until the pod's record is saved and its shim let go, as the agent's own launches are
            node_fence = EpochFence(config.agent_dir()) if pod.epoch is not None else None
            with node_fence.admitting() if node_fence is not None else contextlib.nullcontext(0) as newest:
                if pod.epoch is not None and newest > pod.epoch:
                    self.error = (f"refused: launched under leader epoch {pod.epoch}, but the leader at "
                                  f"epoch {newest} has taken over since; the new leader places the "
                                  "workload itself")
                else:
                    self.local.launch(pod)
        except GpupoolError as exc:
            self.error = exc.message
        except OSError as exc:
            self.error = f"cannot start the pod on {config.name}: {exc}"

    def status(self) -> PodStatus:
        if self.local is None or self.error:
            return PodStatus(self.pod_id, PodPhase.FAILED, message=self.error, node=self.node)
        statuses = self.local.poll()
        if not statuses:
            return PodStatus(self.pod_id, PodPhase.FAILED, message=self.error or "the pod never started",
                             node=self.node)
        return statuses[0]

    def stop(self, grace_s: float) -> None:
        if self.local is not None:
            self.local.stop(self.pod_id, grace_s)

    def read_log(self, stream: str, offset: int) -> LogChunk:
        if self.local is None:
            return LogChunk("", offset, True)
        return self.local.read_log(self.pod_id, stream, offset)

    def node_id(self) -> str:
        """The Ray node this actor runs on (what the tests check placement by)."""
        return str(ray.get_runtime_context().get_node_id())

    def shutdown(self) -> None:
        """Release the pod's resources for good (it has ended and its status was collected)."""
        if self.local is not None:
            self.local.close()
        ray.actor.exit_actor()
