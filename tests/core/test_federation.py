"""Federation placement policies (core/federation.py) on cases small enough to check by hand.

Two members: east (1.0 per GPU-hour, no discount) and west (0.6, half price from 22:00 to 06:00),
one 10 Gbit/s, 40 ms WAN link between them; east sells egress at 0.09 per GB.
"""

from __future__ import annotations

import math

import pytest

from gpupool.core.federation import (
    FedRequest,
    LatencyClass,
    Link,
    Member,
    MemberState,
    Policy,
    PriceBook,
    TimeWindow,
    estimate_start_s,
    parse_policy,
    rank,
    reoffer,
    split_slowdown,
)

NOON = 12 * 3600.0
NIGHT = TimeWindow(22.0, 6.0, 0.5)
EAST = Member("east", "east", PriceBook({"gpu": 1.0}), egress_per_gb=0.09,
              links={"west": Link(10.0, 40.0)}, datasets=frozenset({"corpus"}))
WEST = Member("west", "west", PriceBook({"gpu": 0.6}, (NIGHT,)), egress_per_gb=0.05,
              links={"east": Link(10.0, 40.0)}, datasets=frozenset({"imagenet"}))
MEMBERS = (EAST, WEST)


def free(n: float = 8.0, capacity: float = 8.0, queued_device_s: float = 0.0) -> MemberState:
    return MemberState(True, {"gpu": n}, {"gpu": capacity}, queued_device_s=queued_device_s)


BOTH_FREE = {"east": free(), "west": free()}


def req(**kw: object) -> FedRequest:
    base: dict[str, object] = {"tenant": "t", "home": "east", "devices": 4.0, "runtime_s": 7200.0}
    base.update(kw)
    return FedRequest(**base)  # type: ignore[arg-type]


def names(ranking: object) -> list[str]:
    return [c.member for c in ranking.choices]  # type: ignore[attr-defined]


def test_time_of_day_price_is_integrated_over_the_run() -> None:
    book = WEST.prices
    assert book.cost("gpu", 2, NOON, NOON + 3600) == pytest.approx(1.2)
    # 21:00 -> 23:00: one hour at 0.6, one at the night's 0.3
    assert book.cost("gpu", 1, 21 * 3600, 23 * 3600) == pytest.approx(0.9)
    # a whole day: 16 h at 0.6 and 8 h at 0.3
    assert book.cost("gpu", 1, 0, 86400) == pytest.approx(16 * 0.6 + 8 * 0.3)
    shifted = PriceBook({"gpu": 0.6}, (NIGHT,), utc_offset_h=-8)  # 06:00 UTC is 22:00 local
    assert shifted.cost("gpu", 1, 6 * 3600, 7 * 3600) == pytest.approx(0.3)


def test_home_keeps_work_home_and_says_why_not_elsewhere() -> None:
    ranking = rank(req(), MEMBERS, BOTH_FREE, "home", NOON)
    assert names(ranking) == ["east"]
    assert ranking.choices[0].cost == pytest.approx(8.0)  # 4 GPUs x 2 h x 1.0
    assert [(r.member, "policy home" in r.reason) for r in ranking.refused] == [("west", True)]


def test_cheapest_prefers_west_and_its_night() -> None:
    ranking = rank(req(), MEMBERS, BOTH_FREE, Policy.CHEAPEST, NOON)
    assert names(ranking) == ["west", "east"]
    assert [c.cost for c in ranking.choices] == pytest.approx([4.8, 8.0])
    at_night = rank(req(), MEMBERS, BOTH_FREE, Policy.CHEAPEST, 23 * 3600.0)
    assert at_night.choices[0].cost == pytest.approx(2.4)


def test_fastest_follows_the_queues() -> None:
    east_busy = {"east": free(0, queued_device_s=8 * 3600), "west": free()}
    assert names(rank(req(), MEMBERS, east_busy, "fastest", NOON)) == ["west", "east"]
    west_busy = {"east": free(), "west": free(0, queued_device_s=8 * 1800)}
    ranking = rank(req(), MEMBERS, west_busy, "fastest", NOON)
    assert names(ranking) == ["east", "west"]
    assert ranking.choices[1].expected_start_s == pytest.approx(1800)


def test_balanced_prices_the_wait_the_tenant_states() -> None:
    west_hour_queue = {"east": free(), "west": free(0, queued_device_s=8 * 3600)}
    # west: 4.8 compute + 1 h waiting; east: 8.0 at once
    patient = rank(req(wait_price_per_h=1.0), MEMBERS, west_hour_queue, "balanced", NOON)
    assert names(patient) == ["west", "east"]
    assert [c.score for c in patient.choices] == pytest.approx([5.8, 8.0])
    hurried = rank(req(wait_price_per_h=10.0), MEMBERS, west_hour_queue, "balanced", NOON)
    assert names(hurried) == ["east", "west"]


def test_moving_a_data_set_costs_time_and_egress() -> None:
    ranking = rank(req(dataset="corpus", dataset_gb=500.0), MEMBERS, BOTH_FREE, "cheapest", NOON)
    assert names(ranking) == ["east", "west"]  # 4.8 + 45 egress at west > 8.0 at east
    west = ranking.choices[1]
    assert west.transfer_gb == 500.0
    assert west.egress_cost == pytest.approx(45.0)
    assert west.transfer_s == pytest.approx(500 * 8 / 10 + 0.04)
    assert west.expected_start_s == pytest.approx(west.transfer_s)  # staged while nothing queues
    assert "from east" in west.reason


def test_data_local_runs_only_where_the_data_is_or_refuses() -> None:
    ranking = rank(req(dataset="imagenet", dataset_gb=100.0), MEMBERS, BOTH_FREE, "data-local", NOON)
    assert names(ranking) == ["west"]
    assert ranking.choices[0].transfer_gb == 0.0
    assert "imagenet" in ranking.refused[0].reason
    nowhere = rank(req(dataset="lost", dataset_gb=10.0), MEMBERS, BOTH_FREE, "data-local", NOON)
    assert nowhere.choices == () and len(nowhere.refused) == 2
    # other policies run it where they would, the transfer priced from home
    priced = rank(req(dataset="lost", dataset_gb=10.0), MEMBERS, BOTH_FREE, "cheapest", NOON)
    assert {c.member: c.egress_cost for c in priced.choices} == pytest.approx({"west": 0.9, "east": 0.0})


def test_interactive_and_service_work_stay_in_the_home_region_unless_allowed() -> None:
    for latency in (LatencyClass.INTERACTIVE, LatencyClass.SERVICE):
        ranking = rank(req(latency=latency), MEMBERS, BOTH_FREE, "cheapest", NOON)
        assert names(ranking) == ["east"]
        assert "home region east" in ranking.refused[0].reason
        allowed = rank(req(latency=latency, allow_remote=True), MEMBERS, BOTH_FREE, "cheapest", NOON)
        assert names(allowed) == ["west", "east"]


def test_a_member_down_or_too_small_is_left_out_with_the_reason() -> None:
    states = {"east": MemberState(False, {}, {}), "west": free(8, capacity=8)}
    ranking = rank(req(devices=16), MEMBERS, states, "balanced", NOON)
    assert ranking.choices == ()
    reasons = {r.member: r.reason for r in ranking.refused}
    assert reasons["east"] == "member east is down"
    assert "fewer than the 16 asked" in reasons["west"]


def test_multi_cluster_gang_split_within_its_slowdown_bound() -> None:
    # 12 GPUs, 8 free in each member: only a split starts it
    assert rank(req(devices=12), MEMBERS, BOTH_FREE, "fastest", NOON).choices == ()
    # 1 GB per 1 s step over 10 Gbit/s, 40 ms: 0.8 s + 0.08 s more per step -> 1.88x, refused
    tight = rank(req(devices=12, multi_cluster=True), MEMBERS, BOTH_FREE, "fastest", NOON)
    assert tight.choices == ()
    assert any("1.88x, above the bound 1.25x" in r.reason for r in tight.refused)
    # a 10 s step hides most of it: 1.088x
    loose = rank(req(devices=12, multi_cluster=True, step_s=10.0), MEMBERS, BOTH_FREE, "fastest", NOON)
    split = loose.choices[0]
    assert split.split == (("east", 8.0), ("west", 4.0))
    assert split.runtime_s == pytest.approx(7200 * 1.088)
    assert split.cost == pytest.approx(7200 * 1.088 / 3600 * (8 * 1.0 + 4 * 0.6))
    assert split_slowdown(req(), [EAST]) == 1.0


def test_start_estimate() -> None:
    assert estimate_start_s(free(4), "gpu", 4) == 0.0
    assert estimate_start_s(free(4, queued_device_s=3600), "gpu", 4) == pytest.approx(450)
    busy = MemberState(True, {"gpu": 2}, {"gpu": 8}, running_device_s=8 * 600)
    assert estimate_start_s(busy, "gpu", 4) == pytest.approx(600)
    assert estimate_start_s(MemberState(True, {}, {}), "gpu", 1) == math.inf
    assert estimate_start_s(MemberState(True, {}, {}, expected_start_s=42.0), "gpu", 1) == 42.0


def test_misspelt_policy_gets_did_you_mean() -> None:
    with pytest.raises(ValueError, match="Did you mean 'balanced'"):
        parse_policy("balenced")
    with pytest.raises(ValueError, match="choose one of home, cheapest, fastest, balanced, data-local"):
        rank(req(), MEMBERS, BOTH_FREE, "nearest", NOON)


def test_ranking_is_deterministic_on_ties() -> None:
    twin = Member("aaa", "east", PriceBook({"gpu": 1.0}), links={"west": Link(10.0, 40.0)})
    states = {**BOTH_FREE, "aaa": free()}
    ranking = rank(req(), (EAST, twin, WEST), states, "fastest", NOON)
    assert names(ranking) == ["aaa", "east", "west"]


def test_reoffer_moves_queued_work_only_where_it_starts_sooner_and_ranks_better() -> None:
    # 4 GPUs for 2 h queued at west (0.6): west is full with 4 h of work on its 8 GPUs, east is free
    busy = MemberState(True, {"gpu": 0.0}, {"gpu": 8.0}, running_device_s=8 * 4 * 3600.0)
    full_west = {"east": free(), "west": busy}
    request = req(wait_price_per_h=4.0)
    moved = reoffer(request, "west", MEMBERS, full_west, Policy.BALANCED, NOON)
    assert moved is not None and moved[0].member == "east"  # 8.0 now against 4.8 + 4 h x 4
    assert "starts it in ~0 s, west in ~14400 s" in moved[1] and "under balanced" in moved[1]
    fastest = reoffer(request, "west", MEMBERS, full_west, Policy.FASTEST, NOON)
    assert fastest is not None and fastest[0].member == "east"
    assert reoffer(request, "west", MEMBERS, full_west, Policy.CHEAPEST, NOON) is None  # east is dearer
    assert reoffer(req(wait_price_per_h=0.1), "west", MEMBERS, full_west, Policy.BALANCED, NOON) is None
    assert reoffer(request, "east", MEMBERS, full_west, Policy.HOME, NOON) is None
    # a member with room but that ranks better is not enough when it cannot start it now
    both_full = {"east": free(0.0, queued_device_s=3600.0), "west": busy}
    assert reoffer(request, "west", MEMBERS, both_full, Policy.BALANCED, NOON) is None
    # nor when its free devices are promised to work queued there already
    queued_east = {"east": free(8.0, queued_device_s=3600.0), "west": busy}
    assert reoffer(request, "west", MEMBERS, queued_east, Policy.BALANCED, NOON) is None
