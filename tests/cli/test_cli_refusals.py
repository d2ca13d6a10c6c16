"""Issue 13 item 2: `gpupool submit` refuses at once (exit 2, one sentence naming the largest node)
what no node of the pool could ever hold, and takes model aliases in any case."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.cliproc import gpupool, one_line_error
from factories import node
from live import LiveServer, live_server
from server.fakes import ManualProvider
from server.upproc import UpProcess

H100 = "H100-SXM-80GB"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    nodes = [node("big", devices=8, model=H100, cpu_milli=2000, memory_mib=16384, device_memory_mib=81920),
             node("fat", devices=1, model=H100, cpu_milli=64000, memory_mib=524288, device_memory_mib=81920)]
    with live_server(tmp_path_factory.mktemp("refusals"), ManualProvider(nodes)) as server:
        yield server


def submit(srv: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    return gpupool(srv.url, srv.admin_token, "submit", *args, "--", "true")


@pytest.mark.parametrize(("args", "sentence"), [
    (("--gpus", "9"), f"No node has 9 devices: the largest has 8 x {H100}; "),
    (("--cpu", "100"), "No node has 100 cpus: the largest has 64; "),
    (("--memory", "600GiB"), "No node has 600GiB of memory: the largest has 512GiB; "),
    (("--gpus", "1", "--gpu-memory", "81GiB"),
     f"No device has 81GiB of memory: the largest has 80GiB ({H100})"),
    (("--gpus", "0.5", "--gpu-memory", "90GiB"), "No device has 90GiB of memory"),
    (("--gpu-memory", "8GiB"), "Device memory (--gpu-memory) is reserved per device, so it needs devices"),
    (("--model", "NOSUCHMODEL"), "Unknown device model 'NOSUCHMODEL'; this pool has " + H100),
    (("--model", "a100", "--gpus", "1"), "No node has a device of model A100-80GB: this pool has " + H100),
    (("--model", "h100", "--gpus", "9"), f"No node has 9 devices of model {H100}: the largest has 8; "),
    (("--gpus", "8", "--cpu", "4"), "No single node has all one replica asks for (8 devices, 4 cpus): "
     f"the largest are 8 x {H100} with 2 cpus and 16GiB and 1 x {H100} with 64 cpus"),
])
def test_never_fits_is_refused_at_submit(srv: LiveServer, args: tuple[str, ...], sentence: str) -> None:
    one_line_error(submit(srv, *args), 2, "Error: " + sentence)


def test_each_replica_is_checked_against_the_largest_node(srv: LiveServer) -> None:
    gang = submit(srv, "--gpus", "8", "--replicas", "3")  # a gang may span nodes: 3 replicas of 8 is fine
    assert gang.returncode == 0 and gang.stdout.startswith("w-"), gang.stderr


def test_model_aliases_in_any_case(srv: LiveServer) -> None:
    from gpupool.client import Client

    for alias in ("h100", "H100", "h100 sxm5 80gb", H100.lower()):
        result = submit(srv, "--model", alias, "--gpus", "1")
        assert result.returncode == 0 and result.stderr == "", result.stderr
        with Client(srv.url, srv.admin_token) as pool:
            stored = pool.workload(result.stdout.strip())
        assert stored.spec.resources.models == [H100]


def test_a_simulated_pool_counts_as_nodes(tmp_path: Path) -> None:
    server = UpProcess(tmp_path / "data", ["--simulate", "1x8xH100", "--provider", "fake"]).start()
    try:
        refused = gpupool(server.url, server.token(), "submit", "--gpus", "16", "--", "true")
        one_line_error(refused, 2, f"Error: No node has 16 devices: the largest has 8 x {H100}; ")
        accepted = gpupool(server.url, server.token(), "submit", "--gpus", "8", "--model", "H100", "--",
                           "true")
        assert accepted.returncode == 0 and accepted.stdout.startswith("w-"), accepted.stderr
    finally:
        server.stop()
