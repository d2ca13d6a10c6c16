"""Slurm topology.conf, OpenSM partitions/QoS and NCCL exports."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from gpupool.core.fabric.generate import rail_optimized
from gpupool.core.fabric.parse import parse_topology
from gpupool.core.fabric.partitions import plan_partitions
from gpupool.core.fabric.qos import plan_qos
from gpupool.errors import InvalidInput
from gpupool.exporters.nccl import nccl_env, topo_xml
from gpupool.exporters.opensm import opensm_qos_options, partitions_conf, qos_policy_conf
from gpupool.exporters.slurm import (
    TopologyStyle,
    compress_hostlist,
    parse_topology_conf,
    topology_conf,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "infiniband"


@pytest.fixture(scope="module")
def psmn():
    return parse_topology((FIXTURES / "psmn-X5-fattree.topofile").read_text())


def _switch_structure(text: str) -> dict[str, frozenset[str]]:
    return {name: kids for name, (kids, _) in parse_topology_conf(text).items() if kids}


def test_psmn_switch_structure_matches_the_sites_topology_conf(psmn):
    expected = (FIXTURES / "psmn-X5.topology.conf").read_text()
    ours = topology_conf(psmn)
    assert _switch_structure(ours) == _switch_structure(expected)
    assert set(parse_topology_conf(ours)) == set(parse_topology_conf(expected))
    spines = [ln.strip() for ln in (FIXTURES / "psmn-X5.spine").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    assert _switch_structure(topology_conf(psmn, spines)) == _switch_structure(expected)
    # Leaf switches carry their hosts; unnamed CAs keep their ibnetdiscover names.
    assert "H-003048c749450000" in parse_topology_conf(ours)["S-0008f10500200b50"][1]


def test_levels_style_lists_only_the_level_below(psmn):
    structure = _switch_structure(topology_conf(psmn, style=TopologyStyle.LEVELS))
    assert structure["S-0008f105001086a2"] == {"S-0008f1050010851e", "S-0008f10500108530"}
    assert "S-0008f105001086a2" not in structure["S-0008f1050010851e"]


def test_unknown_spine_is_rejected(psmn):
    with pytest.raises(InvalidInput, match="not a switch"):
        topology_conf(psmn, ["S-nope"])


def test_hostlist():
    names = ["sl390lin1", "sl390lin2", "sl390lin3", "sl390lin7", "gpu01", "gpu02", "x"]
    assert compress_hostlist(names) == "gpu[01-02],sl390lin[1-3,7],x"
    assert compress_hostlist(["H-003048c749450000"]) == "H-003048c749450000"


def test_partitions_conf_lists_port_guids(psmn):
    tenants = {"red": psmn.cas[:2], "blue": psmn.cas[2:4]}
    text = partitions_conf(psmn, plan_partitions(tenants, shared=psmn.cas[4:5]))
    assert "Default=0x7fff" in text
    red_guid = psmn.port_guids[(psmn.cas[0], 1)]
    assert f"0x{red_guid:016x}=full" in text
    member_lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("0x")]
    assert sum("=limited" in ln for ln in member_lines) == 2
    net = parse_topology((FIXTURES / "ibsim-net.2sw2path4hca").read_text())
    with pytest.raises(InvalidInput, match="port GUID"):
        partitions_conf(net, plan_partitions({"red": ["Hca1"]}))


def test_qos_files():
    plan = plan_qos({"critical": 0.8, "batch": 0.2})
    options = opensm_qos_options(plan)
    assert "qos TRUE" in options
    assert "qos_vlarb_low 0:63,1:252" in options
    assert "qos_sl2vl 0,1," in options
    policy = qos_policy_conf(plan, {0x0010: "critical"})
    assert policy.splitlines()[1] == "qos-ulps"
    assert "any, pkey 0x0010 : 1" in policy
    assert policy.strip().endswith("end-qos-ulps")


def test_nccl_env_and_topology_xml():
    fabric = rail_optimized(4, rails=8, ports=16)
    plan = plan_qos({"critical": 0.8, "batch": 0.2})
    env = nccl_env(fabric, "gpu0001", plan.by_name("critical"), pkey_index=1)
    assert env["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}:1" for i in range(8))
    assert env["NCCL_IB_SL"] == "1" and env["NCCL_IB_PKEY"] == "1"
    ours = ET.fromstring(topo_xml(fabric, "gpu0001"))
    azure = ET.fromstring((FIXTURES / "azure-ndv5-topo.xml").read_text())

    def classes(root):
        return sorted(p.get("class") for p in root.iter("pci"))

    assert classes(ours) == classes(azure)
    assert ours.tag == azure.tag == "system" and ours.get("version") == "1"
    assert all(len(list(cpu)) >= 1 for cpu in ours.iter("cpu"))
    with pytest.raises(InvalidInput):
        nccl_env(fabric, "nohost")
