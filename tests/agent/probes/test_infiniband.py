"""The sysfs InfiniBand probe against real sysfs trees (procfs test fixtures) and odd values."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpupool.agent.probes.infiniband import (
    parse_code_text,
    parse_rate_gbps,
    read_ib_ports,
)
from gpupool.core.fabric.telemetry import port_load

SYSFS = Path(__file__).resolve().parents[2] / "fixtures" / "infiniband" / "sysfs" / "class" / "infiniband"


def test_reads_every_port_of_the_fixture():
    ports = read_ib_ports(SYSFS, clock=lambda: 10.0)
    assert [(p.hca, p.port) for p in ports] == [("hfi1_0", 1), ("mlx4_0", 1), ("mlx4_0", 2), ("mlx5_0", 1)]
    mlx5 = ports[-1]
    assert mlx5.rate_gbps == 25.0
    assert (mlx5.state_code, mlx5.state) == (4, "ACTIVE") and mlx5.active
    assert (mlx5.phys_state_code, mlx5.phys_state) == (4, "ACTIVE")  # fixture quirk, not LinkUp
    assert mlx5.counters["port_xmit_data"] == 2880761508848
    assert mlx5.node_guid == 0x0A7FBC1245EFD23B
    assert mlx5.link_layer == "InfiniBand"
    assert ports[0].phys_state == "LinkUp" and ports[0].rate_gbps == 100.0


def test_no_pma_counter_and_missing_root(tmp_path):
    copy = tmp_path / "infiniband"
    shutil.copytree(SYSFS, copy)
    (copy / "mlx5_0" / "ports" / "1" / "counters" / "symbol_error").write_text("N/A (no PMA)\n")
    (copy / "mlx5_0" / "ports" / "1" / "lid").write_text("0x1a\n")
    port = next(p for p in read_ib_ports(copy) if p.hca == "mlx5_0")
    assert port.counters["symbol_error"] is None
    assert port.lid == 26
    assert read_ib_ports(tmp_path / "absent") == []


def test_two_samples_give_a_rate(tmp_path):
    copy = tmp_path / "infiniband"
    shutil.copytree(SYSFS, copy)
    before = next(p for p in read_ib_ports(copy, clock=lambda: 0.0) if p.hca == "mlx5_0")
    data = copy / "mlx5_0" / "ports" / "1" / "counters" / "port_xmit_data"
    data.write_text(str(2880761508848 + 781_250_000))  # 25 Gb over one second
    after = next(p for p in read_ib_ports(copy, clock=lambda: 1.0) if p.hca == "mlx5_0")
    load = port_load(before.to_counter_sample(), after.to_counter_sample())
    assert load.xmit_gbps == pytest.approx(25.0)
    assert load.utilization == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4: ACTIVE", (4, "ACTIVE")),
        ("5: LinkUp", (5, "LinkUp")),
        ("DOWN", (None, "DOWN")),
        (None, (None, "")),
    ],
)
def test_code_text(text, expected):
    assert parse_code_text(text) == expected


def test_rate_text():
    assert parse_rate_gbps("40 Gb/sec (4X QDR)") == 40.0
    assert parse_rate_gbps("56 Gb/sec (4X FDR)") == 56.0
    assert parse_rate_gbps("garbage") is None
