"""OpenB node and pod CSV loaders: good files load, malformed rows name file:line and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.errors import InvalidInput, TraceError
from gpupool.sim.traces.openb import load_openb_nodes, load_openb_pod_rows, load_openb_pods

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "openb"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)


def test_nodes_load_in_file_order_with_their_devices() -> None:
    nodes = load_openb_nodes(FIXTURES / "nodes.csv")
    assert [n.name for n in nodes] == [
        "openb-node-0000",
        "openb-node-0001",
        "openb-node-0002",
        "openb-node-0003",
    ]
    assert [len(n.devices) for n in nodes] == [2, 8, 2, 4]
    assert nodes[1].device_models == frozenset({"G2"})
    assert nodes[2].cpu_milli == 104_000 and nodes[2].memory_mib == 524_288


def test_pods_load_with_fractions_specs_and_times() -> None:
    rows = load_openb_pod_rows(FIXTURES / "pods.csv")
    pods = [r.pod for r in rows]
    assert [(p.num_devices, p.device_milli) for p in pods] == [
        (1, 1000),
        (1, 460),
        (0, 0),
        (1, 250),
        (4, 1000),
        (1, 500),
    ]
    assert pods[3].allowed_models == frozenset({"T4"})
    assert pods[5].allowed_models == frozenset({"V100M16", "V100M32"})
    assert rows[1].creation_time_s == 427061 and rows[4].deletion_time_s is None
    assert rows[5].phase == "Failed" and rows[2].qos == "BE"


def test_multigpu_files_have_only_five_columns() -> None:
    pods = load_openb_pods(FIXTURES / "pods_multigpu.csv")
    assert [(p.num_devices, p.cpu_milli) for p in pods] == [(1, 12000), (2, 24000)]


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("p1,abc,1024,1,1000,,LS,Running,0,1,0", "column cpu_milli must be a whole number"),
        ("p1,1000,-5,1,1000,,LS,Running,0,1,0", "column memory_mib must not be negative"),
        ("p1,1000,1024,2,500,,LS,Running,0,1,0", "must take whole GPUs"),
        ("p1,1000,1024,0,300,,LS,Running,0,1,0", "num_gpu is 0"),
        ("p1,1000,1024,1,1500,,LS,Running,0,1,0", "gpu_milli must be 1..1000"),
        ("p1,1000,1024,1,1000", "expected 11 fields"),
    ],
)
def test_malformed_pod_row_names_file_line_and_problem(tmp_path: Path, row: str, expected: str) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(f"{POD_HEADER}\np0,1000,1024,1,1000,,LS,Running,0,1,0\n{row}\n")
    with pytest.raises(TraceError) as info:
        load_openb_pods(path)
    assert f"{path}:3:" in info.value.message
    assert expected in info.value.message


def test_malformed_node_rows(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,1024,2,T4\nn0,64000,1024,2,T4\n")
    with pytest.raises(TraceError, match=r"nodes.csv:3: node 'n0' appears twice"):
        load_openb_nodes(path)
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,1024,2,\n")
    with pytest.raises(TraceError, match=r"nodes.csv:2: node 'n0' has 2 GPUs but no model"):
        load_openb_nodes(path)


def test_missing_header_column_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,gpu,model\nn0,1,2,T4\n")
    with pytest.raises(TraceError, match=r"nodes.csv:1: the header lacks column\(s\) memory_mib"):
        load_openb_nodes(path)
    with pytest.raises(InvalidInput, match="does not exist"):
        load_openb_nodes(tmp_path / "absent.csv")
