"""QoS plans, tenant partitions, the collective cost model and counter telemetry maths."""

from __future__ import annotations

import pytest

from gpupool.core.fabric.collective import (
    Algorithm,
    placement_cost,
    ring_allreduce_s,
    score_placement,
    tree_allreduce_s,
)
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.partitions import can_talk, isolation_violations, plan_partitions
from gpupool.core.fabric.qos import parse_shares, plan_qos
from gpupool.core.fabric.telemetry import CounterSample, apply_loads, port_load
from gpupool.errors import InvalidInput


def test_qos_gives_critical_eighty_percent():
    plan = plan_qos({"critical": 0.8, "normal": 0.15, "scavenger": 0.05})
    assert plan.share("critical") == pytest.approx(0.8)
    assert plan.share("scavenger") == pytest.approx(0.05)
    assert plan.default.name == "scavenger"  # untagged traffic never lands in the privileged class
    assert plan.sl2vl[plan.by_name("critical").sl] == plan.by_name("critical").vl
    assert len(plan.sl2vl) == 16
    assert all(0 < weight <= 255 for _, weight in plan.vlarb_low)
    assert plan.max_vls == 4


def test_qos_inputs():
    assert parse_shares(["critical=80%", "batch=0.2"]) == {"critical": 0.8, "batch": 0.2}
    with pytest.raises(InvalidInput):
        parse_shares(["critical"])
    with pytest.raises(InvalidInput):
        plan_qos({})
    with pytest.raises(InvalidInput):
        plan_qos({f"c{i}": 1.0 for i in range(9)})
    with pytest.raises(InvalidInput):
        plan_qos({"a": 1.0}).by_name("b")


def test_partitions_isolate_tenants_but_share_services():
    plan = plan_partitions({"red": ["a1", "a2"], "blue": ["b1"]}, shared=["storage"])
    assert isolation_violations(plan) == []
    assert can_talk(plan, "a1", "a2")
    assert can_talk(plan, "a1", "storage") and can_talk(plan, "b1", "storage")
    assert not can_talk(plan, "a1", "b1")
    assert plan.by_tenant("blue").pkey != plan.by_tenant("red").pkey


def test_isolation_check_finds_a_leak():
    from dataclasses import replace

    from gpupool.core.fabric.partitions import Membership, PartitionPlan

    plan = plan_partitions({"red": ["a1"], "blue": ["b1"]})
    red = plan.by_tenant("red")
    leaky = replace(red, members=(*red.members, ("b1", Membership.LIMITED)))
    bad = PartitionPlan((leaky, plan.by_tenant("blue")))
    assert isolation_violations(bad) == [("a1", "red", "b1", "blue")]
    with pytest.raises(InvalidInput):
        plan_partitions({"red": ["x"], "blue": ["x"]})
    with pytest.raises(InvalidInput):
        plan_partitions({"red": ["x"]}, shared=["x"])


def test_alpha_beta_formulas():
    assert ring_allreduce_s(4, 1e6, 1e-6, 1e-9) == pytest.approx(6e-6 + 1.5e-3)
    assert tree_allreduce_s(4, 1e6, 1e-6, 1e-9) == pytest.approx(4 * (1e-6 + 1e-3))
    assert ring_allreduce_s(1, 1e6, 1e-6, 1e-9) == 0.0


def test_placement_cost_prefers_local_and_fast_placements():
    fabric = fat_tree(8, 3, oversubscription=3.0, pods=4)
    one_leaf = fabric.cas[:4]
    spread = fabric.cas[::24][:4]
    local = placement_cost(fabric, one_leaf, 1e9)
    far = placement_cost(fabric, spread, 1e9, Algorithm.RING)
    assert local.bottleneck_gbps == pytest.approx(200 * 64 / 66)
    assert local.time_s <= far.time_s
    assert score_placement(fabric, one_leaf, 1e9) <= local.time_s
    assert placement_cost(fabric, one_leaf[:1], 1e9).time_s == 0.0


def _sample(t: float, xmit: int, symbol: int = 0, wait: int = 0) -> CounterSample:
    counters = {"port_xmit_data": xmit, "port_rcv_data": xmit // 2, "symbol_error": symbol,
                "link_downed": 0, "port_rcv_errors": None, "port_xmit_wait": wait}
    return CounterSample("H-1", 1, t, counters, rate_gbps=100.0)


def test_port_load_rates_errors_and_resets():
    load = port_load(_sample(0.0, 0), _sample(2.0, 2_500_000_000, symbol=3, wait=500))
    assert load.xmit_gbps == pytest.approx(2.5e9 * 4 * 8 / 2 / 1e9)
    assert load.utilization == pytest.approx(0.4)
    assert load.errors["symbol_error"] == 3 and load.sick
    assert load.errors["port_rcv_errors"] == 0
    assert load.xmit_wait_per_s == pytest.approx(250.0)
    reset = port_load(_sample(0.0, 10_000), _sample(1.0, 100))
    assert reset.counter_reset and reset.xmit_gbps == pytest.approx(100 * 32 / 1e9)
    with pytest.raises(ValueError):
        port_load(_sample(1.0, 0), _sample(1.0, 0))


def test_apply_loads_marks_sick_and_hot_links():
    fabric = fat_tree(4, 2)
    ca = fabric.cas[0]
    link = fabric.ca_leaf[ca][2]
    port = link.port_on(ca)
    sick = port_load(
        CounterSample(ca, port, 0.0, {"symbol_error": 0, "port_xmit_data": 0}, 100.0),
        CounterSample(ca, port, 1.0, {"symbol_error": 5, "port_xmit_data": 1_000_000_000}, 100.0),
    )
    updated = apply_loads(fabric, {(ca, port): sick})
    changed = next(lk for lk in updated.links if lk.key == link.key)
    assert not changed.healthy and changed.utilization == pytest.approx(0.32)
    assert changed.available_gbps == 0.0
