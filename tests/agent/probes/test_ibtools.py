"""The real IB tools on an ibsim-emulated fabric: discovery, OpenSM with our files, perfquery, ibtracert.

Every test skips with the reason when ibsim-utils, infiniband-diags or opensm are missing
(scripts/ib-deps.sh installs them). Each fabric runs in its own temp dir on a private
IBSIM_SOCKNAME and is stopped by PID in the fixture's finalizer.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.agent.probes.ibtools import IbSim, ibtracert_hops, missing_tools, routing_seconds
from gpupool.core.fabric.forwarding import compute_tables
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.model import Fabric
from gpupool.core.fabric.parse import parse_topology
from gpupool.core.fabric.partitions import plan_partitions
from gpupool.core.fabric.qos import plan_qos
from gpupool.core.fabric.telemetry import CounterSample, port_load
from gpupool.core.fabric.write import to_ibnetdiscover
from gpupool.exporters.opensm import opensm_qos_options, partitions_conf, qos_policy_conf

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "infiniband"
MISSING = missing_tools()
needs_tools = pytest.mark.skipif(
    bool(MISSING),
    reason=f"needs {', '.join(MISSING)} (Debian ibsim-utils, infiniband-diags, opensm; "
    "run scripts/ib-deps.sh as root)",
)


@pytest.fixture(scope="module")
def fat() -> Fabric:
    return fat_tree(4, 3)


@pytest.fixture(scope="module")
def sim(fat: Fabric, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IbSim]:
    workdir = tmp_path_factory.mktemp("ibsim-fat")
    netfile = workdir / "fabric.topo"
    netfile.write_text(to_ibnetdiscover(fat))
    simulator = IbSim(netfile, workdir).start()
    try:
        yield simulator
    finally:
        simulator.stop()


def _discover(sim: IbSim) -> Fabric:
    done = sim.run(["ibnetdiscover"])
    assert done.returncode == 0, done.stderr[-500:]
    return parse_topology(done.stdout, source="ibnetdiscover")


def _cables(fabric: Fabric, by_desc: bool = False) -> set[tuple[str, int, str, int, str]]:
    def name(node: str) -> str:
        return fabric.nodes[node].desc if by_desc else node

    out = set()
    for link in fabric.links:
        ends = sorted([(name(link.a), link.a_port), (name(link.b), link.b_port)])
        out.add((ends[0][0], ends[0][1], ends[1][0], ends[1][1], link.width_speed))
    return out


@needs_tools
def test_ibnetdiscover_sees_the_generated_fat_tree(sim: IbSim, fat: Fabric):
    found = _discover(sim)
    assert found.switches == fat.switches and found.cas == fat.cas
    assert _cables(found) == _cables(fat)
    assert found.levels == fat.levels


@needs_tools
def test_ibsim_example_net_file(tmp_path: Path):
    netfile = FIXTURES / "ibsim-net.2sw2path4hca"
    expected = parse_topology(netfile.read_text())
    with IbSim(netfile, tmp_path) as simulator:
        found = _discover(simulator)
    assert sorted(n.desc for n in found.nodes.values()) == sorted(expected.nodes)
    assert _cables(found, by_desc=True) == _cables(expected, by_desc=True)


@needs_tools
def test_opensm_accepts_our_partitions_and_qos(sim: IbSim, fat: Fabric):
    tenants = {"red": fat.cas[:4], "blue": fat.cas[4:8]}
    plan = plan_partitions(tenants, shared=fat.cas[8:9])
    qos = plan_qos({"critical": 0.8, "batch": 0.2})
    files = {
        "partitions.conf": partitions_conf(fat, plan),
        "qos-policy.conf": qos_policy_conf(qos, {plan.by_tenant("red").pkey: "critical"}),
        "opensm.conf": opensm_qos_options(qos),
    }
    for name, text in files.items():
        (sim.workdir / name).write_text(text)
    run = sim.opensm_once(
        ["-P", str(sim.workdir / "partitions.conf"), "-Q", "-Y", str(sim.workdir / "qos-policy.conf"),
         "-F", str(sim.workdir / "opensm.conf")]
    )
    assert run.returncode == 0 and run.subnet_up, run.stdout[-500:]
    assert not re.search(r"(?i)parse error|syntax error|failed to parse", run.log)
    assert "Loading QoS policy file" in run.log
    assert run.routing_s is not None and run.routing_s >= 0
    found = _discover(sim)
    red, blue, shared = fat.cas[0], fat.cas[4], fat.cas[8]
    red_key, blue_key = plan.by_tenant("red").pkey, plan.by_tenant("blue").pkey
    assert 0x8000 | red_key in _pkeys(sim, found, red)
    assert 0x8000 | blue_key not in _pkeys(sim, found, red)
    assert {0x8000 | blue_key} & _pkeys(sim, found, blue) and red_key not in _pkeys(sim, found, blue)
    assert red_key in _pkeys(sim, found, shared) and 0x8000 | red_key not in _pkeys(sim, found, shared)
    vlarb = sim.run(["smpquery", "vlarb", str(found.port_lids[(red, 1)]), "1"]).stdout
    assert "0x3F|0xFC" in vlarb.replace(" ", "")


def _pkeys(sim: IbSim, fabric: Fabric, ca: str) -> set[int]:
    out = sim.run(["smpquery", "pkeys", str(fabric.port_lids[(ca, 1)]), "1"]).stdout
    return {int(tok, 16) for tok in re.findall(r"0x[0-9a-fA-F]{4}", out)} - {0}


@needs_tools
def test_perfquery_counters_feed_telemetry(sim: IbSim, fat: Fabric):
    found = _discover(sim)
    if not found.port_lids.get((fat.cas[0], 1)):
        sim.opensm_once()
        found = _discover(sim)
    lid = found.port_lids[(fat.cas[0], 1)]
    samples = []
    for t in (0.0, 1.0):
        # a generous MAD timeout: on a loaded machine ibsim answers later than the default second
        out = sim.run(["perfquery", "-t", "10000", "-x", str(lid), "1"]).stdout
        counters = {
            _snake(name): int(value, 0)
            for name, value in re.findall(r"^(\w+):\.+(\S+)$", out, re.MULTILINE)
            if value[0].isdigit()
        }
        assert "port_xmit_data" in counters, out
        samples.append(CounterSample(fat.cas[0], 1, t, counters, rate_gbps=200.0))
    load = port_load(*samples)
    assert load.xmit_gbps >= 0.0 and not load.sick


def _snake(name: str) -> str:
    aliases = {"SymbolErrorCounter": "symbol_error", "LinkDownedCounter": "link_downed"}
    if name in aliases:
        return aliases[name]
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@needs_tools
def test_tables_agree_with_opensm_paths(sim: IbSim, fat: Fabric):
    run = sim.opensm_once()
    assert run.subnet_up
    found = _discover(sim)
    tables = compute_tables(fat)
    rng = random.Random(3)
    for _ in range(12):
        a, b = rng.sample(fat.cas, 2)
        trace = sim.run(["ibtracert", str(found.port_lids[(a, 1)]), str(found.port_lids[(b, 1)])])
        assert trace.returncode == 0, trace.stderr[-300:]
        ours = tables.ca_hops(tables.cas.index(a), tables.cas.index(b))
        assert ibtracert_hops(trace.stdout) == ours


def test_routing_seconds_from_a_log():
    log = (
        "Nov 30 09:13:35 566251 [FD0396C0] 0x04 -> ucast_mgr_route: building routing with 'updn' "
        "routing algorithm...\n"
        "Nov 30 09:13:36 570525 [FD0396C0] 0x02 -> osm_ucast_mgr_process: updn tables configured on "
        "all switches\n"
    )
    assert routing_seconds(log, "updn") == pytest.approx(1.004274)
    assert routing_seconds(log, "ftree") is None
