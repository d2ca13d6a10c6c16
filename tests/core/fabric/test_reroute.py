"""Incremental re-route after one link fails equals a full recomputation without that link."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core.fabric.forwarding import ForwardingTables, compute_tables
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.model import Fabric, Link
from gpupool.core.fabric.reroute import reroute_after_failure

SHAPES = [
    (8, 3, 1.0, None), (8, 3, 3.0, 4), (6, 3, 2.0, 3), (8, 2, 1.0, None), (4, 3, 1.0, 2), (12, 3, 1.0, 4),
]


@cache
def fabric_and_tables(shape: int) -> tuple[Fabric, ForwardingTables]:
    ports, levels, oversub, pods = SHAPES[shape]
    fabric = fat_tree(ports, levels, oversubscription=oversub, pods=pods)
    return fabric, compute_tables(fabric)


def switch_links(fabric: Fabric, leaf_only: bool) -> list[Link]:
    levels = fabric.levels
    out = [lk for lk in fabric.links if fabric.is_switch(lk.a) and fabric.is_switch(lk.b)]
    if leaf_only:
        out = [lk for lk in out if 0 in (levels[lk.a], levels[lk.b])]
    return out


def assert_same(got: ForwardingTables, want: ForwardingTables) -> None:
    assert np.array_equal(got.ports, want.ports)
    assert np.array_equal(got.hops, want.hops)
    assert want.down_hops is not None and got.down_hops is not None
    assert np.array_equal(got.down_hops, want.down_hops)
    for name in ("src", "dst", "port", "up", "rank", "starts"):
        assert np.array_equal(getattr(got.arrays, name), getattr(want.arrays, name)), name
    assert got.arrays.links == want.arrays.links


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.integers(0, len(SHAPES) - 1), pick=st.integers(0, 10_000), leaf_only=st.booleans())
def test_update_equals_full_recomputation(shape: int, pick: int, leaf_only: bool) -> None:
    fabric, tables = fabric_and_tables(shape)
    candidates = switch_links(fabric, leaf_only)
    link = candidates[pick % len(candidates)]
    update = reroute_after_failure(fabric, tables, link)
    assert_same(update.tables, compute_tables(fabric.without_links([link])))


def test_leaf_uplink_failure_is_incremental_and_touches_few_entries() -> None:
    fabric, tables = fabric_and_tables(0)
    link = switch_links(fabric, leaf_only=True)[0]
    update = reroute_after_failure(fabric, tables, link)
    assert update.incremental
    assert update.hard_columns == 1  # only the leaf that lost an uplink has new hop counts
    assert 0 < update.changed_entries < tables.ports.size // 10
    assert np.array_equal(tables.ports, compute_tables(fabric).ports)  # the input is untouched


def test_two_failures_in_a_row_still_match() -> None:
    fabric, tables = fabric_and_tables(5)
    links = switch_links(fabric, leaf_only=True)
    first, second = links[3], links[17]
    once = reroute_after_failure(fabric, tables, first)
    cut = fabric.without_links([first])
    twice = reroute_after_failure(cut, once.tables, second)
    assert_same(twice.tables, compute_tables(cut.without_links([second])))


def test_unhealthy_link_and_ca_link_fall_back_to_full() -> None:
    fabric, tables = fabric_and_tables(2)
    ca_link = next(lk for lk in fabric.links if not (fabric.is_switch(lk.a) and fabric.is_switch(lk.b)))
    update = reroute_after_failure(fabric, tables, ca_link)
    assert not update.incremental
    assert_same(update.tables, compute_tables(fabric.without_links([ca_link])))
    sick = switch_links(fabric, leaf_only=True)[0]
    marked = fabric.with_links([replace(sick, healthy=False)])
    assert_same(reroute_after_failure(fabric, tables, sick).tables, compute_tables(marked))


def test_cutting_a_leaf_off_falls_back_and_matches() -> None:
    fabric = fat_tree(4, 2, pods=2)  # every leaf has 2 uplinks: cut both of one leaf
    tables = compute_tables(fabric)
    leaf = fabric.ca_leaf[fabric.cas[0]][0]
    uplinks = [lk for lk in switch_links(fabric, leaf_only=True) if leaf in (lk.a, lk.b)]
    first = reroute_after_failure(fabric, tables, uplinks[0])
    cut = fabric.without_links([uplinks[0]])
    second = reroute_after_failure(cut, first.tables, uplinks[1])
    assert_same(second.tables, compute_tables(cut.without_links([uplinks[1]])))
