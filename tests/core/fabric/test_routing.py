"""Up*/down* forwarding tables, ECMP routes, link failure impact and bisection bandwidth."""

from __future__ import annotations

import itertools
import random
from collections import deque

import numpy as np
import pytest

from core.fabric.conftest import FIXTURES, load
from gpupool.core.fabric.analysis import bisection_bandwidth, fail_link, leaf_matrix
from gpupool.core.fabric.forwarding import NO_ROUTE, compute_tables, is_up_down, walk
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.paths import route
from gpupool.errors import InvalidInput


def brute_force_hops(arrays, start: int, goal: int) -> int:
    """Shortest legal up*/down* switch path by BFS over (switch, has-gone-down) states."""
    seen = {(start, False)}
    queue = deque([(start, False, 0)])
    while queue:
        node, down, hops = queue.popleft()
        if node == goal:
            return hops
        for e in np.flatnonzero(arrays.src == node):
            nxt, up = int(arrays.dst[e]), bool(arrays.up[e])
            if up and down:
                continue
            state = (nxt, down or not up)
            if state not in seen:
                seen.add(state)
                queue.append((nxt, state[1], hops + 1))
    return -1


@pytest.mark.parametrize("name", ["fat2", "fat3", "psmn", "oversub"])
def test_tables_are_minimum_hop_and_up_down(name, psmn):
    fabric = {
        "fat2": fat_tree(8, 2),
        "fat3": fat_tree(8, 3),
        "psmn": psmn,
        "oversub": fat_tree(8, 3, oversubscription=3.0, pods=4),
    }[name]
    tables = compute_tables(fabric)
    arrays = tables.arrays
    assert tables.entries == len(fabric.switches) * len(fabric.cas)
    rng = random.Random(7)
    for _ in range(60):
        a, b = rng.sample(fabric.cas, 2)
        steps = walk(fabric, tables, a, b)
        switches = [s for s, _ in steps]
        assert steps, f"no route {a} -> {b}"
        assert is_up_down(arrays, switches)
        leaf_a, leaf_b = (arrays.index[fabric.ca_leaf[x][0]] for x in (a, b))
        assert len(switches) - 1 == brute_force_hops(arrays, leaf_a, leaf_b)
        assert steps[-1][1] == fabric.ca_leaf[b][1]


def test_ecmp_spreads_cas_of_a_leaf_over_all_uplinks():
    fabric = fat_tree(8, 2)
    tables = compute_tables(fabric)
    leaf0 = tables.arrays.index[fabric.ca_leaf[fabric.cas[0]][0]]
    remote = [i for i, ca in enumerate(tables.cas) if tables.ca_leaf[i] != leaf0]
    assert set(tables.ports[leaf0, remote].tolist()) == {5, 6, 7, 8}


def test_route_counts_paths_and_prices_them():
    fabric = fat_tree(8, 3)
    far = route(fabric, fabric.cas[0], fabric.cas[-1])
    assert far.hops == 6 and far.ecmp_paths == 16 and len(far.paths) == 16
    assert far.bottleneck_gbps == pytest.approx(200 * 64 / 66)
    assert far.best is not None and far.best.latency_ns() == pytest.approx(5 * 100 + 6 * 5)
    same_leaf = route(fabric, fabric.cas[0], fabric.cas[1])
    assert same_leaf.hops == 2 and same_leaf.ecmp_paths == 1
    with pytest.raises(InvalidInput):
        route(fabric, fabric.switches[0], fabric.cas[0])


def test_hot_link_is_avoided_by_best_path():
    from dataclasses import replace

    fabric = fat_tree(8, 2)
    first = route(fabric, fabric.cas[0], fabric.cas[-1])
    hot = first.paths[0].links[1]
    loaded = fabric.with_links([replace(hot, utilization=0.9)])
    again = route(loaded, fabric.cas[0], fabric.cas[-1])
    assert again.best is not None and hot.key not in {lk.key for lk in again.best.links}
    sick = fabric.with_links([replace(hot, healthy=False)])
    assert route(sick, fabric.cas[0], fabric.cas[-1]).ecmp_paths == first.ecmp_paths - 1


def test_unreachable_when_isolated():
    fabric = load("ibsim-net.2sw2path4hca")
    trunks = [lk for lk in fabric.links if fabric.is_switch(lk.a) and fabric.is_switch(lk.b)]
    cut = fabric.without_links(trunks)
    tables = compute_tables(cut)
    assert (tables.ports == NO_ROUTE).any()
    assert not route(cut, "Hca1", "Hca2").reachable
    assert route(fabric, "Hca1", "Hca2").ecmp_paths == 2


def test_link_failure_reports_degraded_and_lost_pairs():
    fabric = fat_tree(8, 3)
    core_link = next(lk for lk in fabric.links if fabric.nodes[lk.a].desc.startswith("core"))
    impact = fail_link(fabric, core_link)
    assert impact.lost_pairs == 0
    assert impact.degraded_pairs == 16 * 112  # pod 0's CAs to every CA of the other pods
    assert impact.degraded_sample[0][2:] == (16, 15)
    ca_link = fabric.ca_leaf[fabric.cas[0]][2]
    assert fail_link(fabric, ca_link).lost_pairs == len(fabric.cas) - 1
    single = load("ibsim-net.2sw2path4hca")
    links = [lk for lk in single.links if single.is_switch(lk.a) and single.is_switch(lk.b)]
    assert fail_link(single, links[0]).lost_pairs == 0
    assert fail_link(single, links[0]).degraded_pairs == 4
    assert fail_link(single.without_links(links[:1]), links[1]).lost_pairs == 4


def test_bisection_non_blocking_and_oversubscribed():
    full = fat_tree(8, 3)
    assert bisection_bandwidth(full, full.cas).per_ca_gbps == pytest.approx(200 * 64 / 66)
    thin = fat_tree(8, 2, oversubscription=3.0)
    assert bisection_bandwidth(thin, thin.cas).per_ca_gbps == pytest.approx(200 * 64 / 66 / 3)
    one_leaf = thin.cas[:4]
    assert bisection_bandwidth(thin, one_leaf).per_ca_gbps == pytest.approx(200 * 64 / 66)


def test_leaf_matrix_psmn_all_connected(psmn):
    matrix = leaf_matrix(psmn)
    n = len(matrix.leaves)
    off_diagonal = ~np.eye(n, dtype=bool)
    assert (matrix.paths[off_diagonal] > 0).all()
    assert all(len(cas) for cas in matrix.cas_per_leaf.values())


def test_spine_file_roots_change_ranks(psmn):
    spines = [ln.strip() for ln in (FIXTURES / "psmn-X5.spine").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    tables = compute_tables(psmn, roots=spines)
    assert sorted(tables.arrays.roots) == sorted(spines)
    assert all(tables.arrays.rank[tables.arrays.index[s]] == 0 for s in spines)
    for a, b in itertools.islice(itertools.combinations(psmn.cas, 2), 0, 400, 7):
        assert is_up_down(tables.arrays, [s for s, _ in walk(psmn, tables, a, b)])


def _reference_ports(fabric) -> tuple[list[str], list[str], dict[tuple[int, int], int]]:  # type: ignore[no-untyped-def]
    """The forwarding rule written out one switch and one CA at a time, with a queue BFS for the
    ranks: the CA in slot k of its leaf leaves switch w by the (k mod n)-th of w's n legal
    minimum-hop next hops toward that leaf, in port order."""
    from gpupool.core.fabric.updown import hop_tables, next_hop_mask, switch_arrays

    arrays = switch_arrays(fabric)
    adjacency: dict[int, list[int]] = {}
    for s, d in zip(arrays.src.tolist(), arrays.dst.tolist(), strict=True):
        adjacency.setdefault(s, []).append(d)
    rank = {arrays.index[r]: 0 for r in arrays.roots}
    queue = deque(rank)
    while queue:
        node = queue.popleft()
        for other in adjacency.get(node, []):
            if other not in rank:
                rank[other] = rank[node] + 1
                queue.append(other)
    unreached = arrays.num_switches + 1
    assert [rank.get(s, unreached) for s in range(arrays.num_switches)] == arrays.rank.tolist()
    leaf_rows = [arrays.index[leaf] for leaf in arrays.leaves]
    dist, ddown = hop_tables(arrays, leaf_rows)
    valid = next_hop_mask(arrays, dist, ddown)
    ports: dict[tuple[int, int], int] = {}
    slot_on: dict[int, int] = {}
    for c, ca in enumerate(fabric.cas):
        attach = fabric.ca_leaf.get(ca)
        if attach is None or not attach[2].healthy:
            continue
        leaf = arrays.index[attach[0]]
        slot = slot_on.get(leaf, 0)
        slot_on[leaf] = slot + 1
        column = leaf_rows.index(leaf)
        for w in range(arrays.num_switches):
            if w == leaf:
                ports[(w, c)] = attach[1]
                continue
            hops = [int(arrays.port[e]) for e in range(len(arrays.src))
                    if arrays.src[e] == w and valid[e, column]]
            if hops:
                ports[(w, c)] = hops[slot % len(hops)]
    return arrays.switches, fabric.cas, ports


@pytest.mark.parametrize("failed", [0, 12])
def test_tables_follow_the_rule_written_out_one_switch_at_a_time(failed: int) -> None:
    fabric = fat_tree(8, 3)
    switch_links = [lk for lk in fabric.links if fabric.is_switch(lk.a) and fabric.is_switch(lk.b)]
    fabric = fabric.without_links(random.Random(failed).sample(switch_links, failed))
    switches, cas, expected = _reference_ports(fabric)
    tables = compute_tables(fabric)
    got = {(w, c): int(tables.ports[w, c]) for w in range(len(switches)) for c in range(len(cas))
           if tables.ports[w, c] != NO_ROUTE}
    assert got == expected
