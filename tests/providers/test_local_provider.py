"""The local provider with real processes: slices reach the environment, restarts keep every record."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from factories import pod_python
from gpupool.agent.mps import MpsDaemon
from gpupool.core.model import Slice
from gpupool.errors import InvalidInput, UnknownName
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.base import Capability
from gpupool.providers.local import LocalProvider
from gpupool.providers.nodespec import SIMULATED_LABEL

DUMP_ENV = (pod_python(), "-c", "import json, os; print(json.dumps(dict(os.environ)))")


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[LocalProvider]:
    p = LocalProvider(tmp_path / "agent", simulate="2xH100,1xT4", node_name="box")
    yield p
    p.close(stop_pods=True)


def wait_final(provider: LocalProvider, pod_id: str, timeout_s: float = 10.0) -> PodStatus:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = {s.pod_id: s for s in provider.poll()}[pod_id]
        if status.phase.is_final:
            return status
        time.sleep(0.02)
    raise AssertionError(f"{pod_id} did not finish")


def run_env(provider: LocalProvider, pod: PodLaunch) -> dict[str, str]:
    provider.launch(pod)
    assert wait_final(provider, pod.pod_id).phase is PodPhase.SUCCEEDED
    return json.loads(provider.read_log(pod.pod_id).text)


def test_simulated_devices_are_labelled(provider: LocalProvider) -> None:
    (node,) = provider.nodes()
    assert node.name == "box" and node.labels[SIMULATED_LABEL] == "true"
    assert [d.model for d in node.devices] == ["H100-SXM-80GB", "H100-SXM-80GB", "T4"]
    assert [d.index for d in node.devices] == [0, 1, 2]
    assert all(d.simulated for d in node.devices)
    assert node.cpu_milli > 0 and node.memory_mib > 0
    assert Capability.GPU in provider.missing_capabilities()


def test_environment_carries_exactly_the_slice(provider: LocalProvider) -> None:
    device = provider.nodes()[0].devices[1]
    env = run_env(provider, PodLaunch(pod_id="slice", workload_id="w", node="box", command=DUMP_ENV,
                                      slices=(Slice(1, 250, 8192),), env={"CUDA_VISIBLE_DEVICES": "0,1"}))
    assert env["CUDA_VISIBLE_DEVICES"] == device.uuid
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    assert env["GPUPOOL_TORCH_MEMORY_FRACTION"] == "0.1"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.1"
    assert env["CUPY_GPU_MEMORY_LIMIT"] == str(8192 * 2**20)
    assert env["GPUPOOL_DEVICE_MILLI"] == "250" and env["GPUPOOL_DEVICE_MEMORY_MIB"] == "8192"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env  # simulated devices: no daemon to connect to
    assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR"} & set(env)
    layers = {row["layer"]: row["active"] for row in provider.agent.isolation_layers("slice")}
    assert layers["device_selection"] and not layers["mps"]


def test_gang_member_environment(provider: LocalProvider) -> None:
    env = run_env(provider, PodLaunch(pod_id="r1", workload_id="w", node="box", command=DUMP_ENV,
                                      slices=(Slice(0, 1000),), world_size=2, rank=1, local_rank=1,
                                      master_addr="10.1.2.3", master_port=29501, ib_hcas=("mlx5_0",)))
    assert (env["WORLD_SIZE"], env["RANK"], env["LOCAL_RANK"]) == ("2", "1", "0")  # its device is its 0
    assert (env["NNODES"], env["NODE_RANK"], env["NPROC_PER_NODE"]) == ("2", "1", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["NCCL_IB_HCA"]) == ("10.1.2.3", "29501", "=mlx5_0")
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


def test_agent_restart_loses_no_record(tmp_path: Path, pod_scratch_root: Path) -> None:
    gate = pod_scratch_root / f"gate-{tmp_path.name}"  # where a pod's account can see it
    first = LocalProvider(tmp_path / "agent", simulate="1xT4", node_name="box")
    first.launch(PodLaunch(pod_id="done", workload_id="w", node="box", command=("true",)))
    wait_final(first, "done")
    first.launch(PodLaunch(pod_id="live", workload_id="w", node="box",
                           command=("sh", "-c", f"echo up; while [ ! -e {gate} ]; do sleep 0.02; done")))
    first.close()
    second = LocalProvider(tmp_path / "agent", simulate="1xT4", node_name="box")
    try:
        statuses = {s.pod_id: s for s in second.poll()}
        assert statuses["done"].phase is PodPhase.SUCCEEDED
        assert statuses["live"].phase is PodPhase.RUNNING
        gate.touch()
        assert wait_final(second, "live").phase is PodPhase.SUCCEEDED
        assert second.read_log("live").text == "up\n"
    finally:
        second.close(stop_pods=True)


def test_host_limits_through_a_cgroup(tmp_path: Path) -> None:
    """Two agents under one cgroup root (two pools on a machine) each run a pod named alike: each
    gets a cgroup of its own (a pod's end kills every process in its cgroup)."""
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory\n")
    providers = [LocalProvider(tmp_path / name, simulate="1xT4", node_name="box", cgroup_root=root)
                 for name in ("agent", "other-agent")]
    try:
        for provider, cpu_milli in zip(providers, (2000, 500), strict=True):
            assert Capability.CGROUPS not in provider.missing_capabilities()
            provider.launch(PodLaunch(pod_id="cg", workload_id="w", node="box", command=("true",),
                                      cpu_milli=cpu_milli, memory_mib=512))
            assert wait_final(provider, "cg").phase is PodPhase.SUCCEEDED
        made = [root / f"pod-{provider.agent.runner.mark}-cg" for provider in providers]
        assert sorted(p.name for p in root.iterdir() if p.is_dir()) == sorted(p.name for p in made)
        assert [(p / "cpu.max").read_text() for p in made] == ["200000 100000", "50000 100000"]
        for cgroup in made:
            assert (cgroup / "cgroup.procs").read_text().strip().isdigit()  # the runner moved it in
    finally:
        for provider in providers:
            provider.close(stop_pods=True)


def test_mps_daemon_started_for_real_fractional_slices(tmp_path: Path) -> None:
    log = tmp_path / "mps.log"
    binary = tmp_path / "nvidia-cuda-mps-control"
    binary.write_text(f'#!/bin/sh\necho "args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY" >> {log}\ncat >> {log}\n')
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    daemon = MpsDaemon(tmp_path / "state", binary=str(binary))
    daemon.start()
    daemon.start()
    daemon.stop()
    daemon.stop()
    lines = log.read_text().splitlines()
    assert lines[0] == f"args=-d pipe={tmp_path / 'state' / 'mps' / 'pipe'}"
    assert lines[-1] == "quit" and len([x for x in lines if x.startswith("args=")]) == 2


def test_the_mps_daemon_gets_no_variable_of_the_server(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The MPS server the control daemon starts runs as a tenant's account and inherits the daemon's
    environment: the server's own variables (its database URL, tokens) stay out; the paths and the
    CUDA and NVIDIA settings an operator gives it go in."""
    log = tmp_path / "env.log"
    binary = tmp_path / "nvidia-cuda-mps-control"
    binary.write_text(f"#!/bin/sh\nenv > {log}\n")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("GPUPOOL_DATABASE_URL", "postgresql://pool:hunter2@db/pool")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50")
    monkeypatch.setenv("NVIDIA_DRIVER_CAPABILITIES", "compute")
    MpsDaemon(tmp_path / "state", binary=str(binary)).start()
    seen = dict(line.split("=", 1) for line in log.read_text().splitlines() if "=" in line)
    assert "hunter2" not in log.read_text() and "s3cr3t" not in log.read_text()
    assert seen["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert seen["NVIDIA_DRIVER_CAPABILITIES"] == "compute"
    assert seen["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "state" / "mps" / "pipe")
    assert seen["PATH"] == os.environ["PATH"]


def test_no_gpu_means_one_clear_line_or_the_fallback(tmp_path: Path) -> None:
    bare = LocalProvider(tmp_path / "a", node_name="box")
    try:
        (node,) = bare.nodes()
        if node.devices and not node.devices[0].simulated:
            pytest.skip("this machine has NVIDIA devices")
        assert node.devices == ()
        assert "NVML" in bare.missing_capabilities()[Capability.GPU]
    finally:
        bare.close()
    fallback = LocalProvider(tmp_path / "b", node_name="box", fallback_simulate="2xA10")
    try:
        assert [d.model for d in fallback.nodes()[0].devices] == ["A10", "A10"]
    finally:
        fallback.close()


def test_bad_simulate_spec(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="DEVICESxMODEL"):
        LocalProvider(tmp_path, simulate="lots of gpus")
    with pytest.raises(UnknownName):
        LocalProvider(tmp_path, simulate="2xH1000")



def test_ib_ports_come_from_sysfs(tmp_path: Path) -> None:
    root = Path(__file__).parents[1] / "fixtures" / "infiniband" / "sysfs" / "class" / "infiniband"
    provider = LocalProvider(tmp_path / "agent", simulate="1xT4", node_name="box", ib_sysfs_root=root)
    try:
        ports = {(p.hca, p.port): p for p in provider.nodes()[0].ib_ports}
        assert ("mlx5_0", 1) in ports and ("mlx4_0", 2) in ports
        assert ports[("mlx5_0", 1)].state == "ACTIVE" and ports[("mlx5_0", 1)].rate_gbps > 0
    finally:
        provider.close()


def test_stop_passes_the_callers_grace_period_to_the_agent(tmp_path: Path) -> None:
    now = [500.0]
    provider = LocalProvider(tmp_path / "agent", simulate="1xT4", node_name="box", clock=lambda: now[0])
    try:
        provider.launch(PodLaunch(pod_id="g", workload_id="w", node="box", command=("sleep", "60")))
        provider.stop("g", grace_s=7.5)
        record = provider.agent.runner.known("g")
        assert record is not None
        assert (record.stop_requested_at_s, record.kill_deadline_s) == (500.0, 507.5)
        assert wait_final(provider, "g").exit_code == 143  # sleep takes SIGTERM's default
    finally:
        provider.close(stop_pods=True)
