"""`gpupool submit --launcher torchrun` through the real entry point against a real `gpupool up`:
a two-pod gang of two processes each forms one torch.distributed world on CPU (gloo) and
all-reduces, so WORLD_SIZE and RANK count processes, not pods."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_inproc import run_cli
from factories import pod_python
from ports import gang_config
from server.upproc import UpProcess

pytestmark = pytest.mark.slow


def _closed(path: Path) -> str:
    """The first of `path` (resolved) and its parents that other accounts cannot enter ('' if none)."""
    resolved = path.resolve()
    for part in (resolved, *resolved.parents):
        if part.stat().st_mode & 0o001 == 0:
            return str(part)
    return ""


def _pod_python() -> tuple[str, dict[str, str], str]:
    """(a Python the pods can run with torch, the environment it needs, why there is none)."""
    probe = subprocess.run([sys.executable, "-c", "import torch, torch.distributed as d; "
                            "assert d.is_gloo_available(); print(torch.__path__[0])"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        return "", {}, ("torch (CPU build, with gloo) is not installed in this interpreter; `make test-deps` "
                        "installs it from a local wheel where one is available")
    if os.geteuid() != 0 or not _closed(Path(sys.executable)):
        return sys.executable, {}, ""
    # pods run as their tenant's account, and this interpreter lives where it cannot enter: the
    # system's Python of the same version, with torch's directory on its path, if that one is open
    site = str(Path(probe.stdout.strip()).parent)
    python = pod_python()
    same = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                          text=True, timeout=60).stdout.strip() == str(sys.version_info[:2])
    if not same or _closed(Path(site)):
        return "", {}, (f"{_closed(Path(sys.executable))} is closed to the pods' accounts and no open Python "
                        f"{sys.version_info[0]}.{sys.version_info[1]} can import torch from {site}")
    return python, {"PYTHONPATH": site}, ""


@pytest.fixture(scope="module")
def torch_python() -> tuple[str, dict[str, str]]:
    """The pods' Python with torch and its environment (probed once, when a test asks)."""
    python, env, missing = _pod_python()
    if missing:
        pytest.skip(missing)
    return python, env


POD_NETWORK = "10.241.0.0/16"
"""This file's own pod network: pools on one machine must not share one."""
ALL_REDUCE = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
value = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(value)
local = f"{os.environ['LOCAL_RANK']}/{os.environ['LOCAL_WORLD_SIZE']}"
print(f"rank {dist.get_rank()} of {dist.get_world_size()} node {os.environ['NODE_RANK']} "
      f"local {local}: sum {int(value.item())}", flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    base = tmp_path_factory.mktemp("torchrun")
    config = base / "pool.yaml"
    config.write_text(gang_config())  # rank 0 binds MASTER_PORT on the host where pods share its network
    server = UpProcess(base / "data", ["--simulate", "2x2xH100", "--config", str(config)],
                       env={"GPUPOOL_POD_NETWORK": POD_NETWORK}).start()
    try:
        yield server
    finally:
        server.stop()


def gp(pool: UpProcess, *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env = {**base, "GPUPOOL_URL": pool.url, "GPUPOOL_TOKEN": pool.token()}
    return run_cli(args, env, timeout_s=180)


def test_a_torchrun_gang_all_reduces_across_two_pods_of_two_processes(
        torch_python: tuple[str, dict[str, str]], pool: UpProcess) -> None:
    python, python_env = torch_python
    submitted = gp(pool, "submit", "--replicas", "2", "--gpus", "2", "--cpu", "2", "--launcher", "torchrun",
                   *(f"--env={k}={v}" for k, v in python_env.items()), "--", python, "-c", ALL_REDUCE)
    assert submitted.returncode == 0, submitted.stderr
    wid = submitted.stdout.strip()
    waited = gp(pool, "wait", wid)
    outputs = [gp(pool, "logs", wid, "--rank", str(rank)).stdout for rank in (0, 1)]
    assert waited.returncode == 0, (waited.stdout, *outputs)
    for node, output in enumerate(outputs):
        lines = sorted(line for line in output.splitlines() if line.startswith("rank "))
        # four processes (2 pods x 2 devices): ranks 0-3, each pod's two local ranks, sum 1+2+3+4
        assert lines == [f"rank {2 * node + local} of 4 node {node} local {local}/2: sum 10"
                         for local in (0, 1)], output


def test_an_unknown_launcher_is_refused_with_the_closest_name(pool: UpProcess) -> None:
    refused = gp(pool, "submit", "--launcher", "torchrn", "--", "true")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == ("Error: Option --launcher takes none or torchrun, got 'torchrn'. "
                                      "Did you mean 'torchrun'?")
    with pool.client() as api:  # the API refuses it too, in a sentence
        answer = api.post("/workloads", json={"command": ["true"], "launcher": "mpirun"})
    assert answer.status_code in (400, 422), answer.text
    assert "there is no launcher 'mpirun'; use one of none, torchrun." in answer.text
