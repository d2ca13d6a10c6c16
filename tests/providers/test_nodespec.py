"""Simulated nodes from a compact spec or an OpenB node CSV."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.errors import InvalidInput, TraceError, UnknownName
from gpupool.providers.fake import nodes_from_spec


def test_spec_builds_nodes_with_profile_memory() -> None:
    nodes = nodes_from_spec("2x8xH100,3x4xv100m32")
    assert len(nodes) == 5
    assert [len(n.devices) for n in nodes] == [8, 8, 4, 4, 4]
    assert nodes[0].devices[0].model == "H100-SXM-80GB"
    assert nodes[0].devices[0].memory_mib == 80 * 1024
    assert nodes[2].devices[0].memory_mib == 32 * 1024
    assert all(d.simulated for n in nodes for d in n.devices)
    assert len({n.name for n in nodes}) == 5
    assert all(n.cpu_milli > 0 and n.memory_mib > 0 for n in nodes)


def test_spec_is_deterministic_and_uuids_unique() -> None:
    first, second = nodes_from_spec("2x8xT4"), nodes_from_spec("2x8xT4")
    assert first == second
    uuids = [d.uuid for n in first for d in n.devices]
    assert len(set(uuids)) == len(uuids)


@pytest.mark.parametrize("spec", ["2x8", "x8xH100", "2*8*H100", "", "2x8xH100,,"])
def test_bad_spec_explains_the_syntax(spec: str) -> None:
    with pytest.raises(InvalidInput, match="NODESxDEVICESxMODEL"):
        nodes_from_spec(spec)


def test_unknown_model_is_named() -> None:
    with pytest.raises(UnknownName, match="H1000"):
        nodes_from_spec("1x8xH1000")


def test_openb_csv(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,0,\nn1,96000,786432,8,G2\n")
    nodes = nodes_from_spec(str(path))
    assert [n.name for n in nodes] == ["n0", "n1"]
    assert nodes[0].devices == ()
    assert nodes[1].cpu_milli == 96000 and len(nodes[1].devices) == 8
    assert nodes[1].devices[0].memory_mib == 0


def test_openb_csv_bad_row_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,0,\nn1,lots,1,8,G2\n")
    with pytest.raises(TraceError, match=r"nodes\.csv:3: column 'cpu_milli'"):
        nodes_from_spec(str(path))


def test_openb_node_list(shared_data: Path) -> None:
    nodes = nodes_from_spec(str(shared_data / "openb" / "openb_node_list_gpu_node.csv"))
    assert len(nodes) == 1213
    assert sum(len(n.devices) for n in nodes) == 6212
