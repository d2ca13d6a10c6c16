"""The one contract every provider keeps, run against each registered provider."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from gpupool.core.model import Slice
from gpupool.errors import GpupoolError, NotFound, ProviderError
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.base import Capability, Provider
from gpupool.providers.fake import FakeProvider
from gpupool.providers.local import LocalProvider
from gpupool.providers.localpool import LocalPool
from gpupool.providers.nodespec import nodes_from_spec
from gpupool.providers.registry import make_provider, provider_names


@dataclass
class Harness:
    provider: Provider
    node: str
    ok: Callable[[str], PodLaunch]
    fail: Callable[[str, int], PodLaunch]
    long: Callable[[str], PodLaunch]
    settle: Callable[[], None]
    checkpointed: Callable[[str, str], PodLaunch]
    """A pod of workload (2nd argument) that reports one checkpoint while it runs, then ends."""
    timeout_s: float = 10.0
    """How long a short pod may take to end (a Ray actor takes seconds to start on a small machine)."""

    def status(self, pod_id: str) -> PodStatus:
        return {s.pod_id: s for s in self.provider.poll()}[pod_id]

    def wait_final(self, pod_id: str, timeout_s: float | None = None) -> PodStatus:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while time.monotonic() < deadline:
            status = self.status(pod_id)
            if status.phase.is_final:
                return status
            self.settle()
        raise AssertionError(f"pod {pod_id} did not finish: {self.status(pod_id)}")


def _local(tmp_path: Path) -> Harness:
    provider = make_provider("local", state_dir=tmp_path / "agent", simulate="2xT4", node_name="here")
    assert isinstance(provider, LocalProvider)

    return _processes(provider, "here")


def _local_pool(tmp_path: Path) -> Harness:
    provider = LocalPool(nodes_from_spec("2x2xT4"), tmp_path / "agents")
    return _processes(provider, provider.nodes()[1].name)


def _processes(provider: Provider, node: str) -> Harness:
    """Pods as real processes (the local provider and the simulated pool of local agents)."""

    def pod(pod_id: str, *command: str, workload_id: str = "w") -> PodLaunch:
        return PodLaunch(pod_id=pod_id, workload_id=workload_id, node=node, command=command,
                         slices=(Slice(0, 500, 4096),))

    touch = 'touch "$GPUPOOL_CHECKPOINT_DIR/.checkpoint"'
    return Harness(provider, node, ok=lambda p: pod(p, "true"),
                   fail=lambda p, code: pod(p, "sh", "-c", f"exit {code}"),
                   long=lambda p: pod(p, "sleep", "60"), settle=lambda: time.sleep(0.02),
                   checkpointed=lambda p, w: pod(p, "sh", "-c", touch, workload_id=w))


def _fake(_: Path) -> Harness:
    provider = make_provider("fake", nodes="2x4xT4", duration_s=5.0)
    assert isinstance(provider, FakeProvider)
    node = provider.nodes()[0].name

    def pod(pod_id: str, workload_id: str = "w", **env: str) -> PodLaunch:
        return PodLaunch(pod_id=pod_id, workload_id=workload_id, node=node, command=("train",),
                         slices=(Slice(0, 500, 4096),), env=env)

    return Harness(provider, node, ok=lambda p: pod(p),
                   fail=lambda p, code: pod(p, GPUPOOL_FAKE_EXIT_CODE=str(code)),
                   long=lambda p: pod(p, GPUPOOL_FAKE_DURATION_S="1e9"),
                   settle=lambda: provider.advance(1.0),
                   checkpointed=lambda p, w: pod(p, w, GPUPOOL_FAKE_CHECKPOINT_S="2"))


def _ray(cluster: Provider) -> Harness:
    """A provider attached to the module's Ray cluster (one simulated node), as a restarted server's."""
    from gpupool.providers.ray import RayProvider

    assert isinstance(cluster, RayProvider)
    provider = RayProvider(cluster.address, data_dir=cluster.data_dir)
    node = provider.nodes()[0]
    for device in node.devices:  # faults an earlier test left on the shared node
        provider.clear_fault(node.name, device.uuid)
    provider.clear_fault(node.name)
    return replace(_processes(provider, node.name), timeout_s=60.0)


BUILDERS = {"local": _local, "fake": _fake, "localpool": _local_pool}
CLUSTER_BUILDERS = {"ray": _ray}
"""Providers whose harness attaches to a cluster the module starts once (ray_cluster)."""


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    """A Ray head and one simulated worker node on this machine (slow to start: once per module)."""
    pytest.importorskip("ray", reason="the ray provider needs Ray (pip install 'gpupool[ray]')")
    from gpupool.providers.ray import RayProvider

    provider = RayProvider(simulate="1x2xT4", data_dir=tmp_path_factory.mktemp("ray"))
    try:
        yield provider
    finally:
        provider.close(stop_pods=True)


def test_every_registered_provider_is_under_contract() -> None:
    assert set(provider_names()) <= set(BUILDERS) | set(CLUSTER_BUILDERS)


@pytest.fixture(params=sorted(set(BUILDERS) | set(CLUSTER_BUILDERS)))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param in CLUSTER_BUILDERS:
        built = CLUSTER_BUILDERS[request.param](request.getfixturevalue(f"{request.param}_cluster"))
    else:
        built = BUILDERS[request.param](tmp_path)
    yield built
    if isinstance(built.provider, (LocalProvider, LocalPool)) or built.provider.name == "ray":
        built.provider.close(stop_pods=True)  # type: ignore[call-arg]
    built.provider.close()


def test_nodes_are_listed_and_stable(harness: Harness) -> None:
    first, second = harness.provider.nodes(), harness.provider.nodes()
    assert first == second
    assert harness.node in {n.name for n in first}
    devices = [d for n in first for d in n.devices]
    assert devices and len({d.uuid for d in devices}) == len(devices)


def test_missing_capabilities_all_have_reasons(harness: Harness) -> None:
    missing = harness.provider.missing_capabilities()
    assert all(isinstance(c, Capability) and reason.strip() for c, reason in missing.items())


def test_pod_succeeds_with_exit_code_zero(harness: Harness) -> None:
    harness.provider.launch(harness.ok("ok-1"))
    status = harness.wait_final("ok-1")
    assert (status.phase, status.exit_code) == (PodPhase.SUCCEEDED, 0)


def test_pod_failure_reports_its_exit_code(harness: Harness) -> None:
    harness.provider.launch(harness.fail("bad-1", 3))
    status = harness.wait_final("bad-1")
    assert (status.phase, status.exit_code) == (PodPhase.FAILED, 3)


def test_launch_is_idempotent(harness: Harness) -> None:
    harness.provider.launch(harness.long("twice"))
    harness.provider.launch(harness.long("twice"))
    assert [s.pod_id for s in harness.provider.poll()].count("twice") == 1


def test_an_acknowledged_pod_leaves_poll_but_stays_known(harness: Harness) -> None:
    """forget_pods is poll()'s acknowledgement: the caller stored the pod's final state."""
    provider = harness.provider
    provider.launch(harness.ok("acked"))
    provider.launch(harness.long("unended"))
    harness.wait_final("acked")
    provider.forget_pods(["acked", "unended", "never-launched"])
    listed = {s.pod_id for s in provider.poll()}
    assert "acked" not in listed, "a pod whose final state was acknowledged is still polled"
    assert "unended" in listed, "a pod that has not ended is never forgotten"
    assert provider.read_log("acked").finished, "its log outlives the acknowledgement"
    provider.launch(harness.ok("acked"))  # still known by id: not started again
    provider.stop("acked")
    provider.forget_pods(["acked"])
    harness.settle()
    assert "acked" not in {s.pod_id for s in provider.poll()}
    provider.stop("unended", grace_s=0)


def test_launch_on_unknown_node_raises(harness: Harness) -> None:
    pod = harness.ok("nowhere")
    with pytest.raises(ProviderError):
        harness.provider.launch(PodLaunch(pod_id="nowhere", workload_id="w", node="no-such-node",
                                          command=pod.command))


def test_stop_ends_a_running_pod_and_is_idempotent(harness: Harness) -> None:
    harness.provider.launch(harness.long("long-1"))
    assert harness.status("long-1").phase in (PodPhase.STARTING, PodPhase.RUNNING)
    harness.provider.stop("long-1", grace_s=5.0)
    harness.provider.stop("long-1", grace_s=5.0)
    harness.provider.stop("never-launched")
    status = harness.wait_final("long-1")
    assert status.phase is PodPhase.STOPPED
    assert status.exit_code == 143


def test_logs_are_served_and_unknown_pods_are_not_found(harness: Harness) -> None:
    harness.provider.launch(harness.ok("logged"))
    harness.wait_final("logged")
    chunk = harness.provider.read_log("logged")
    assert chunk.finished and chunk.next_offset >= 0
    with pytest.raises(NotFound):
        harness.provider.read_log("nope")
    with pytest.raises(GpupoolError):
        harness.provider.read_log("logged", stream="stdin")


def test_fault_injection_marks_device_then_node_unhealthy(harness: Harness) -> None:
    if Capability.FAULT_INJECTION in harness.provider.missing_capabilities():
        pytest.skip("provider cannot inject faults")
    node = next(n for n in harness.provider.nodes() if n.name == harness.node)
    uuid = node.devices[1].uuid
    harness.provider.inject_fault(harness.node, uuid, reason="xid 79")
    node = next(n for n in harness.provider.nodes() if n.name == harness.node)
    assert [d.healthy for d in node.devices[:2]] == [True, False] and node.healthy
    harness.provider.inject_fault(harness.node, reason="power")
    assert not next(n for n in harness.provider.nodes() if n.name == harness.node).healthy
    harness.provider.clear_fault(harness.node, uuid)
    harness.provider.clear_fault(harness.node)
    node = next(n for n in harness.provider.nodes() if n.name == harness.node)
    assert node.healthy and all(d.healthy for d in node.devices)
    events = harness.provider.health_events()
    assert [(e.device_uuid, e.healthy) for e in events] == [
        (uuid, False), ("", False), (uuid, True), ("", True)]
    assert events[0].reason == "xid 79"
    with pytest.raises(NotFound):
        harness.provider.inject_fault(harness.node, "GPU-nope")
    with pytest.raises(NotFound):
        harness.provider.inject_fault("no-such-node")


def test_faults_are_idempotent_and_touch_only_their_target(harness: Harness) -> None:
    if Capability.FAULT_INJECTION in harness.provider.missing_capabilities():
        pytest.skip("provider cannot inject faults")
    before = {n.name: n for n in harness.provider.nodes()}
    uuid = before[harness.node].devices[0].uuid
    harness.provider.clear_fault(harness.node, uuid)  # nothing to clear: no event
    harness.provider.inject_fault(harness.node, uuid)
    harness.provider.inject_fault(harness.node, uuid)
    after = {n.name: n for n in harness.provider.nodes()}
    assert [(e.node, e.device_uuid, e.healthy) for e in harness.provider.health_events()] == [
        (harness.node, uuid, False)]
    assert {name: n for name, n in after.items() if name != harness.node} == \
        {name: n for name, n in before.items() if name != harness.node}
    assert [d.healthy for d in after[harness.node].devices][1:] == \
        [d.healthy for d in before[harness.node].devices][1:]


def test_a_checkpoint_mark_outlives_attempts_until_the_workload_is_forgotten(harness: Harness) -> None:
    workload = "w-ckpt-" + harness.node
    assert harness.provider.checkpoint_s(workload) is None
    harness.provider.launch(harness.checkpointed("ckpt-1", workload))
    first = harness.wait_final("ckpt-1")
    assert first.phase is PodPhase.SUCCEEDED
    mark = harness.provider.checkpoint_s(workload)
    assert mark is not None and first.started_at_s is not None and first.finished_at_s is not None
    assert first.started_at_s - 1.0 <= mark <= first.finished_at_s + 1.0
    assert harness.provider.checkpoint_s("w-other") is None
    harness.provider.launch(harness.long("ckpt-other"))  # another workload's pod changes nothing
    harness.provider.launch(replace(harness.long("ckpt-2"), workload_id=workload))  # the next attempt
    assert harness.provider.checkpoint_s(workload) == mark
    harness.provider.forget_workload(workload)
    harness.provider.forget_workload(workload)
    harness.provider.forget_workload("never-seen")
    assert harness.provider.checkpoint_s(workload) is None


def test_close_is_idempotent(harness: Harness) -> None:
    harness.provider.close()
    harness.provider.close()
