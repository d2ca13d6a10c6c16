"""`gpupool fabric ...` end to end through the CLI, on the committed fixtures and generated fabrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "infiniband"
PSMN = str(FIXTURES / "psmn-X5-fattree.topofile")
runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["fabric", *args])
    return result.exit_code, result.output


def test_show_json_has_the_contract_keys():
    code, out = run("show", PSMN, "--json")
    assert code == 0
    data = json.loads(out)
    assert {"switches", "cas", "links", "levels", "degraded_links"} <= set(data)
    assert (data["switches"], data["cas"], len(data["degraded_links"])) == (11, 89, 23)
    assert data["levels"]["2"] == ["S-0008f105001086a2"]


def test_show_table_and_node_map(tmp_path):
    names = tmp_path / "map"
    names.write_text('0x0008f105001086a2 "top-spine"\n')
    code, out = run("show", PSMN, "--node-map", str(names), "--json")
    assert code == 0 and json.loads(out)["roots"] == ["top-spine"]
    code, out = run("show", PSMN)
    assert code == 0 and "degraded links" in out


def test_route_and_tables():
    code, out = run("route", PSMN, "H-78e7d1030022cae4", "H-003048c749450000", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["hops"] == 4 and data["ecmp_paths"] > 1 and data["bottleneck_gbps"] == 16.0
    code, out = run("tables", PSMN, "--json")
    data = json.loads(out)
    assert code == 0 and data["entries"] == 11 * 89 and data["unreachable_entries"] == 0
    assert {"switches", "cas", "entries", "wall_s"} <= set(data)


def test_tables_with_roots_file_and_dump(tmp_path):
    dump = tmp_path / "lft.txt"
    code, out = run("tables", PSMN, "--roots", str(FIXTURES / "psmn-X5.spine"), "-o", str(dump), "--json")
    assert code == 0 and len(json.loads(out)["roots"]) == 5
    assert dump.read_text().count("Switch ") == 11


def test_fail_link():
    code, out = run("fail-link", PSMN, "S-0008f10500108bba:13", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["lost_pairs"] == 0 and data["degraded_pairs"] > 0
    code, out = run("fail-link", PSMN, "H-78e7d1030022cae4:1", "--json")
    assert json.loads(out)["lost_pairs"] == 88


@pytest.mark.parametrize(
    "args",
    [
        ("route", PSMN, "nope", "H-003048c749450000"),
        ("route", PSMN, "S-0008f105001086a2", "H-003048c749450000"),
        ("fail-link", PSMN, "S-0008f10500108bba"),
        ("fail-link", PSMN, "S-0008f10500108bba:2"),
        ("show", "/nonexistent/fabric.topo"),
        ("export", "slurm", PSMN, "--style", "sideways"),
        ("export", "opensm-qos", "--class", "critical"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(args):
    code, out = run(*args)
    assert code == 2
    assert "Error:" in out and "Traceback" not in out


def test_generate_export_and_draw(tmp_path):
    topo = tmp_path / "rail.topo"
    assert run("generate", "rail", "--nodes", "4", "--ports", "16", "-o", str(topo))[0] == 0
    code, out = run("export", "nccl", str(topo), "--host", "gpu0002", "--use-class", "critical",
                    "--topo-out", str(tmp_path / "topo.xml"))
    assert code == 0 and "NCCL_IB_HCA==mlx5_0:1" in out and "NCCL_IB_SL=1" in out
    assert (tmp_path / "topo.xml").read_text().startswith("<system")
    code, out = run("export", "opensm-partitions", str(topo), "--tenant", "red=gpu0000,gpu0001",
                    "--tenant", "blue=gpu0002", "--shared", "gpu0003")
    assert code == 0 and out.count("=full") == 24 + 1 and "=limited" in out
    code, out = run("export", "slurm", PSMN, "--spines", str(FIXTURES / "psmn-X5.spine"))
    assert code == 0 and "SwitchName=S-0008f105001086a2 Switches=" in out
    code, out = run("generate", "fat-tree", "--ports", "8", "--levels", "2", "--format", "ibsim")
    assert code == 0 and out.count("Switch\t") == 12
    png = tmp_path / "ft.png"
    assert run("draw", PSMN, "-o", str(png))[0] == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
