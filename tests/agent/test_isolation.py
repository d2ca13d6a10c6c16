"""Isolation layers: each slice becomes exactly the variables and limits that enforce it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.agent.isolation import (
    SITECUSTOMIZE_DIR,
    Layer,
    find_cgroup_root,
    plan_isolation,
    prepare_cgroup,
)
from gpupool.core.model import Slice
from gpupool.errors import InvalidInput
from gpupool.pods import PodLaunch
from gpupool.providers.fake import nodes_from_spec

H100 = nodes_from_spec("1x4xH100")[0]
ASCEND = nodes_from_spec("1x8xAscend910B")[0]
P100 = nodes_from_spec("1x2xP100")[0]
MPS = {"CUDA_MPS_PIPE_DIRECTORY": "/run/mps/pipe", "CUDA_MPS_LOG_DIRECTORY": "/run/mps/log"}


def launch(*slices: Slice, **kw: object) -> PodLaunch:
    return PodLaunch(pod_id="p", workload_id="w", node="n", command=("x",), slices=slices, **kw)  # type: ignore[arg-type]


def layers(plan) -> dict[Layer, bool]:  # type: ignore[no-untyped-def]
    return {s.layer: s.active for s in plan.layers}


def test_fractional_slice_gets_device_mps_and_framework_caps() -> None:
    plan = plan_isolation(launch(Slice(2, 250, 8192)), H100, mps_client_env=MPS)
    env = plan.env
    assert env["CUDA_VISIBLE_DEVICES"] == H100.devices[2].uuid
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps/pipe"
    assert env["GPUPOOL_TORCH_MEMORY_FRACTION"] == "0.1"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.1"
    assert env["CUPY_GPU_MEMORY_LIMIT"] == str(8192 * 2**20)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(SITECUSTOMIZE_DIR)
    assert layers(plan)[Layer.MPS] and layers(plan)[Layer.FRAMEWORK_CAPS]


def test_whole_devices_run_bare() -> None:
    plan = plan_isolation(launch(Slice(0, 1000), Slice(1, 1000)), H100, mps_client_env=MPS)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == f"{H100.devices[0].uuid},{H100.devices[1].uuid}"
    assert not any(k.startswith("CUDA_MPS_") for k in plan.env)
    assert "CUPY_GPU_MEMORY_LIMIT" not in plan.env and "PYTHONPATH" not in plan.env


def test_without_a_daemon_limits_are_set_but_reported_unenforced() -> None:
    plan = plan_isolation(launch(Slice(0, 750, 24576)), H100, mps_client_env=None)
    assert plan.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "75"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in plan.env
    assert not layers(plan)[Layer.MPS]


def test_npu_uses_the_vendor_variable_by_index() -> None:
    plan = plan_isolation(launch(Slice(3, 1000), Slice(5, 1000)), ASCEND)
    assert plan.env["ASCEND_RT_VISIBLE_DEVICES"] == "3,5"
    assert "CUDA_VISIBLE_DEVICES" not in plan.env


def test_device_without_mps_limits_gets_none() -> None:
    plan = plan_isolation(launch(Slice(0, 500, 4096)), P100, mps_client_env=MPS)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in plan.env
    assert not layers(plan)[Layer.MPS]


def test_cpu_pod_sees_no_device() -> None:
    plan = plan_isolation(launch(cpu_milli=500, memory_mib=256), H100)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == ""
    assert plan.host_limits.rlimit_data_bytes == 256 * 2**20


def test_gang_environment() -> None:
    pod = launch(Slice(0, 1000), world_size=4, rank=2, local_rank=1, master_addr="10.0.0.1",
                 master_port=29600, ib_hcas=("mlx5_0", "mlx5_3"))
    env = plan_isolation(pod, H100).env
    assert {k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
                                "NCCL_IB_HCA")} == {
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29600", "WORLD_SIZE": "4", "RANK": "2",
        "LOCAL_RANK": "0", "NCCL_IB_HCA": "=mlx5_0,mlx5_3"}  # the pod sees its one device as 0
    assert (env["NNODES"], env["NODE_RANK"], env["NPROC_PER_NODE"]) == ("4", "2", "1")
    assert "RANK" not in plan_isolation(launch(Slice(0, 1000)), H100).env


def test_a_pod_of_several_devices_gets_pod_names_and_no_per_process_ones() -> None:
    """Two pods of four devices are eight torch processes: calling them WORLD_SIZE 2 would lie, so
    only the pod-level layout (torchrun's --nnodes/--node-rank/--nproc-per-node) is set."""
    pod = launch(*(Slice(i, 1000) for i in range(4)), world_size=2, rank=1, local_rank=1, local_world_size=2,
                 master_addr="10.0.0.1", master_port=29600)
    env = plan_isolation(pod, H100).env
    assert (env["NNODES"], env["NODE_RANK"], env["NPROC_PER_NODE"]) == ("2", "1", "4")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29600")
    assert not {"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"} & set(env)
    fractional = plan_isolation(launch(Slice(0, 250), world_size=2, rank=1), H100).env
    assert (fractional["NPROC_PER_NODE"], fractional["WORLD_SIZE"], fractional["RANK"]) == ("1", "2", "1")


def test_a_user_cannot_set_the_gang_layout() -> None:
    pod = launch(Slice(0, 1000), world_size=2, rank=1, env={"NNODES": "9", "NODE_RANK": "7", "RANK": "5"})
    env = plan_isolation(pod, H100).process_env({}, pod.env)
    assert (env["NNODES"], env["NODE_RANK"], env["RANK"]) == ("2", "1", "1")
    alone = launch(Slice(0, 1000))  # nor does the agent's own environment leak a layout into a pod
    assert not {"NNODES", "NODE_RANK", "NPROC_PER_NODE"} & set(plan_isolation(alone, H100).process_env(
        {"NNODES": "3", "NODE_RANK": "1", "NPROC_PER_NODE": "8"}, {}))


def test_gang_environment_carries_the_local_world_and_the_fabric_settings() -> None:
    pod = launch(Slice(0, 1000), world_size=4, rank=3, local_rank=1, local_world_size=2,
                 master_addr="10.0.0.1", master_port=29_777, ib_hcas=("mlx5_0:1",), ib_sl=3,
                 ib_pkey_index=1)
    env = plan_isolation(pod, H100).env
    assert (env["LOCAL_WORLD_SIZE"], env["NCCL_IB_SL"], env["NCCL_IB_PKEY"]) == ("1", "3", "1")
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1"
    unreserved = plan_isolation(launch(Slice(0, 1000), world_size=2, rank=1), H100).env
    assert "MASTER_PORT" not in unreserved  # the server reserves it; no guessed port
    assert not {"NCCL_IB_SL", "NCCL_IB_PKEY"} & set(unreserved)


def test_unknown_device_index_is_a_clear_error() -> None:
    with pytest.raises(InvalidInput, match="device index 9"):
        plan_isolation(launch(Slice(9, 1000)), H100)


def test_user_cannot_override_isolation_variables() -> None:
    plan = plan_isolation(launch(Slice(1, 500, 1024)), H100, mps_client_env=MPS)
    env = plan.process_env({"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "CUDA_MPS_X": "1"},
                           {"CUDA_VISIBLE_DEVICES": "all", "MINE": "1"})
    assert env["CUDA_VISIBLE_DEVICES"] == H100.devices[1].uuid
    assert env["MINE"] == "1" and env["PATH"] == "/bin" and "CUDA_MPS_X" not in env


def fake_cgroup(tmp_path: Path) -> Path:
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    return root


def test_cgroup_root_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_cgroup_root(tmp_path) is None  # not a cgroup v2 directory
    root = fake_cgroup(tmp_path)
    assert find_cgroup_root(root) == root
    monkeypatch.setenv("GPUPOOL_CGROUP_ROOT", str(root))
    assert find_cgroup_root() == root


def test_cgroup_limits_are_written(tmp_path: Path) -> None:
    root = fake_cgroup(tmp_path)
    plan = plan_isolation(launch(Slice(0, 500), cpu_milli=1500, memory_mib=2048), H100, cgroup_root=root)
    limits = prepare_cgroup(plan.host_limits, plan.cgroup_files)
    assert limits.cgroup_dir == root / "pod-p"
    assert (root / "pod-p" / "cpu.max").read_text() == "150000 100000"
    assert (root / "pod-p" / "memory.max").read_text() == str(2048 * 2**20)


def test_sitecustomize_caps_torch_when_imported(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(
        "calls = []\n"
        "class cuda:\n"
        "    is_available = staticmethod(lambda: True)\n"
        "    device_count = staticmethod(lambda: 2)\n"
        "    set_per_process_memory_fraction = staticmethod(lambda f, i: calls.append((f, i)))\n"
    )
    (fake / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n")
    code = "import json, os, torch; print(json.dumps([torch.calls, os.environ.get('CHAINED')]))"
    env = {"PATH": os.environ.get("PATH", ""), "GPUPOOL_TORCH_MEMORY_FRACTION": "0.25",
           "PYTHONPATH": os.pathsep.join([str(SITECUSTOMIZE_DIR), str(fake)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [[[0.25, 0], [0.25, 1]], "yes"]
    env.pop("GPUPOOL_TORCH_MEMORY_FRACTION")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)[0] == []
