"""A simulated pool or a generated fabric too large for memory (a typo: 2x99999999xH100, --ports 1000000)
is refused with one sentence naming the limit, before anything is built or started. Each case is just
past its limit; where a missing refusal would go on to build something large, what builds is replaced
by a stand-in that fails at once, so a missing refusal fails the test instead of filling memory."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import pytest

from cli_inproc import run_cli
from gpupool.agent import node as agent_node
from gpupool.core.fabric import generate
from gpupool.errors import InvalidInput, TraceError
from gpupool.profiles import default_profiles
from gpupool.providers import nodespec
from ports import free_port

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200"}


def _refused(done: subprocess.CompletedProcess[str], said: str) -> None:
    assert done.returncode == 2 and said in done.stderr, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def _never(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise AssertionError("building started before the size was refused")


def test_up_refuses_too_many_devices_a_node_before_it_starts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    done = run_cli(["up", "--simulate", "1x65xH100", "--data-dir", str(data), "--port", str(free_port())],
                   _env(), timeout_s=15)
    _refused(done, "Node spec '1x65xH100' gives each node 65 devices, but a simulated node holds at most "
                   "64 (more than any real server); give 64 or fewer.")
    assert not data.exists()  # refused before the data directory, its lock and the server


def test_sim_replay_refuses_too_many_devices_a_node(tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    done = run_cli(["sim", "replay", "--cluster", "2x65xH100", "--trace",
                    f"philly:{FIXTURES / 'replay' / 'philly_tiny.csv'}", "--json", str(out)], _env())
    _refused(done, "gives each node 65 devices, but a simulated node holds at most 64")
    assert not out.exists()


@pytest.mark.parametrize(("spec", "said"), [
    ("50001x1xH100", "The node spec asks for 50,001 nodes, but a simulated pool holds at most 50,000"),
    ("25000x1xH100,25001x1xA100", "asks for 50,001 nodes"),
    ("40001x10xH100", "The node spec asks for 400,010 devices, but a simulated pool holds at most 400,000"),
    ("1x8xH100,1x65xA100", "Node spec '1x65xA100' gives each node 65 devices"),
])
def test_a_spec_past_a_limit_is_refused_before_a_node_is_built(spec: str, said: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodespec, "simulated_devices", _never)
    with pytest.raises(InvalidInput, match=re.escape(said)):
        nodespec.nodes_from_spec(spec)


def test_the_limits_themselves_are_accepted() -> None:
    assert [len(n.devices) for n in nodespec.nodes_from_spec("2x64xH100")] == [64, 64]
    nodespec.check_spec("50000x8xH100")  # read and bounded only: nothing is built


def test_a_node_files_row_past_the_device_limit_is_refused(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,65,V100M16\n")
    monkeypatch.setattr(nodespec, "simulated_devices", _never)
    said = "nodes.csv:2: column 'gpu' is 65, but a simulated node holds at most 64"
    with pytest.raises(TraceError, match=re.escape(said)):
        nodespec.nodes_from_openb_csv(nodes)  # `gpupool up --simulate nodes.csv`
    done = run_cli(["sim", "fill", "--nodes", str(nodes), "--pods", str(FIXTURES / "openb" / "pods.csv"),
                    "--seed", "42"], _env())
    _refused(done, "nodes.csv:2: column gpu is 65, but a simulated node holds at most 64 devices")


def test_a_nodes_simulated_devices_past_the_limit_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_node, "simulated_devices", _never)
    said = "'60xH100,5xA100' are 65 in all, but a simulated node holds at most 64"
    with pytest.raises(InvalidInput, match=re.escape(said)):
        agent_node.simulated_local_devices("60xH100,5xA100", "n0", default_profiles())


@pytest.mark.parametrize("args", [
    ["fat-tree", "--ports", "256"],
    ["rail", "--nodes", "4", "--ports", "256"],
], ids=["fat-tree", "rail"])
def test_fabric_generate_refuses_a_radix_past_infiniband(args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "f.topo"
    done = run_cli(["fabric", "generate", *args, "--out", str(out)], _env())
    _refused(done, "needs a switch radix of at most 254 ports (InfiniBand numbers a switch's ports 1 to "
                   f"254), got {args[args.index('--ports') + 1]}; give a smaller radix.")
    assert not out.exists()


def test_a_fat_tree_past_the_host_limit_is_refused_before_it_is_built(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generate, "_three_level", _never)
    said = "This 3-level fat tree would have 145,161 hosts, but a generated fabric has at most 131,072"
    with pytest.raises(InvalidInput, match=re.escape(said)):
        generate.fat_tree(254, levels=3, pods=9)  # 9 pods x 127 leaves x 127 hosts
    assert len(generate.fat_tree(254, levels=2).cas) == 254 * 127  # the largest radix itself is fine
