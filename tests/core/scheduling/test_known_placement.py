"""A greedy victim search whose single-pod preemptor ends up fitting exactly one node skips its trial
placement there (`preemption.place_known`): the victims elsewhere are never taken off the state, and
`_drop_apart`'s trial is not made either. The bound's checks take off only the victims on the nodes
they check (`Detached.flush(rows)`). The same decisions; where two nodes fit, the trial is made."""

from __future__ import annotations

import random

import pytest
from bench_loop import assert_same_cycles, config_loop

from factories import node
from gpupool.core.model import Allocation, ClusterSnapshot, PodPlacement, PodRequest, Slice, Workload
from gpupool.core.quota import QuotaConfig, devices_milli
from gpupool.core.scheduling import preemption
from gpupool.core.scheduling.preemption import VictimIndex, select_victims
from gpupool.core.scheduling.view import ClusterView

NOW = 1000.0


def _pod(name: str, devices: int = 1) -> PodRequest:
    return PodRequest(name, cpu_milli=1000 * devices, memory_mib=4096 * devices, num_devices=devices,
                      device_milli=1000)


def _job(wid: str, cls: str, pods: int = 1, devices: int = 1) -> Workload:
    return Workload(id=wid, pods=tuple(_pod(f"p{i}", devices) for i in range(pods)), tenant="t",
                    priority_class=cls, submit_time_s=0.0)


def _at(w: Workload, start_s: float, *where: tuple[str, int]) -> Allocation:
    return Allocation(w, tuple(PodPlacement(p.name, n, (Slice(d, 1000, 32_768),), p.cpu_milli, p.memory_mib)
                               for p, (n, d) in zip(w.pods, where, strict=True)), start_s)


def _search(view: ClusterView) -> tuple[list[str], list[str]]:
    policy = view.placement_policy("first-fit", {})
    x = _job("x", "high", devices=8)
    chosen = select_victims(x, "", view, policy, random.Random(0), NOW, set(), VictimIndex(view, NOW))
    assert chosen is not None
    return sorted(r.workload.id for r in chosen.victims), [view.state.nodes[a.node].name
                                                          for _, a in chosen.gang.allocs]


def _two_fit_at_once() -> ClusterView:
    """Nodes a and b, each with seven `best-effort` jobs (b's the cheapest, then a's) and one pod of a
    two-pod `best-effort` gang g (the dearest) on device 7. A whole-node `high` preemptor walks b's,
    then a's, then g, which makes a and b fit at once: first-fit lands on a, its node order."""
    allocations = [_at(_job(f"b{i}", "best-effort"), 900.0, ("b", i)) for i in range(7)]
    allocations += [_at(_job(f"a{i}", "best-effort"), 800.0, ("a", i)) for i in range(7)]
    allocations.append(_at(_job("g", "best-effort", pods=2), 100.0, ("a", 7), ("b", 7)))
    view = ClusterView.from_snapshot(ClusterSnapshot((node("a"), node("b")), tuple(allocations)))
    view.materialize()
    return view


@pytest.mark.parametrize("known", [True, False])
def test_two_nodes_fitting_at_once_are_placed_on_as_the_policy_chooses(known: bool) -> None:
    """Not the first node the walk touched (b): the trial is made, on a; b's jobs are put back."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preemption, "place_known", known)
        victims, nodes = _search(_two_fit_at_once())
    assert nodes == ["a"]
    assert victims == sorted([f"a{i}" for i in range(7)] + ["g"])


def _one_fits() -> list[Allocation]:
    """g alone on a; b's device 7 held by a `high` job, which no `high` preemptor takes."""
    allocations = [_at(_job(f"b{i}", "best-effort"), 900.0, ("b", i)) for i in range(7)]
    allocations.append(_at(_job("h", "high"), 0.0, ("b", 7)))
    allocations += [_at(_job(f"a{i}", "best-effort"), 800.0, ("a", i)) for i in range(7)]
    allocations.append(_at(_job("g", "best-effort"), 100.0, ("a", 7)))
    return allocations


def _counted_search(known: bool) -> tuple[list[str], list[str], int, list[str]]:
    """`_search` on `_one_fits`' pool: victims, node, placements made, victims taken off the state."""
    view = ClusterView.from_snapshot(ClusterSnapshot((node("a"), node("b")), tuple(_one_fits())))
    view.materialize()
    placed: list[int] = []
    detached: list[str] = []
    original_place, original_flush = preemption.place_gang, preemption.Detached.flush

    def place(*args: object) -> object:
        placed.append(1)
        return original_place(*args)  # type: ignore[arg-type]

    def flush(self: preemption.Detached, rows: object = None) -> None:
        before = [r.workload.id for r in self.pending]
        original_flush(self, rows)  # type: ignore[arg-type]
        left = {r.workload.id for r in self.pending}
        detached.extend(w for w in before if w not in left)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preemption, "place_known", known)
        mp.setattr(preemption, "place_gang", place)
        mp.setattr(preemption.Detached, "flush", flush)
        victims, nodes = _search(view)
    return victims, nodes, len(placed), sorted(set(detached))


def test_one_node_fitting_is_not_tried_and_the_victims_elsewhere_never_leave() -> None:
    """After g goes only a fits. Neither trial is made: one placement in all, the final one; b's
    jobs never left the state. With the trials: two placements, and b's jobs went and came back."""
    on_a = sorted([f"a{i}" for i in range(7)] + ["g"])
    assert _counted_search(True) == (on_a, ["a"], 1, on_a)
    assert _counted_search(False) == (on_a, ["a"], 2, sorted(on_a + [f"b{i}" for i in range(7)]))


@pytest.mark.parametrize(("config", "least"), [("default", 5), ("bench/configs/full.yaml", 5)])
def test_the_bench_loop_decides_the_same_without_the_known_trials(config: str, least: int) -> None:
    """Every decision of every cycle (victims in order, placements) and the rng after it equal with
    the trials made; trials were skipped (under `full.yaml`, every queue with a quota: checked
    against it as the trials would)."""
    skipped: list[int] = []
    original = preemption._drop_apart_on

    def counted(chosen: list[preemption.Running], node: int, *rest: object) -> list[preemption.Running]:
        skipped.append(node)
        return original(chosen, node, *rest)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preemption, "_drop_apart_on", counted)
        known = config_loop(config)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preemption, "place_known", False)
        tried = config_loop(config)
    assert len(skipped) >= least, f"only {len(skipped)} searches skipped their trial"
    assert_same_cycles(known, tried)
    assert sum(len(r.preempted) for r, _ in known) > 0


def test_a_queue_with_a_quota_makes_its_trials() -> None:
    """`_one_fits`' pool, every job of tenant t, whose queue may hold 9 devices (h holds
    one): once g goes, a holds the preemptor, but with b's jobs put back the queue is over its
    quota, so `_drop_apart`'s trial fails and b's jobs stay victims. Skipping it would drop them."""
    allocations = _one_fits()
    quota = QuotaConfig.per_tenant({"t": {"device_milli": devices_milli(9)}})
    view = ClusterView.from_snapshot(ClusterSnapshot((node("a"), node("b")), tuple(allocations)), quota)
    view.materialize()
    policy = view.placement_policy("first-fit", {})
    x = _job("x", "high", devices=8)
    chosen = select_victims(x, "t", view, policy, random.Random(0), NOW, set(), VictimIndex(view, NOW))
    assert chosen is not None
    assert sorted(r.workload.id for r in chosen.victims) == sorted(
        [f"a{i}" for i in range(7)] + [f"b{i}" for i in range(7)] + ["g"])


def test_a_quota_that_refuses_the_trial_not_made_walks_on() -> None:
    """As above, with one more job k of t on a third node c (the rest of c held by another tenant's
    `high` work) and started earliest: once g goes, a holds the preemptor but t would use 10 devices,
    so that trial fails and the walk goes on to k; with k gone it passes. All sixteen go (b's and k
    back over the quota again), the preemptor on a."""
    allocations = _one_fits()
    allocations.append(_at(_job("k", "best-effort"), 50.0, ("c", 0)))
    others = [Workload(id=f"u{i}", pods=(_pod("p0"),), tenant="u", priority_class="high", submit_time_s=0.0)
              for i in range(1, 8)]
    allocations += [_at(w, 0.0, ("c", i + 1)) for i, w in enumerate(others)]
    quota = QuotaConfig.per_tenant({"t": {"device_milli": devices_milli(9)}})
    view = ClusterView.from_snapshot(
        ClusterSnapshot((node("a"), node("b"), node("c")), tuple(allocations)), quota)
    view.materialize()
    x = _job("x", "high", devices=8)
    chosen = select_victims(x, "t", view, view.placement_policy("first-fit", {}), random.Random(0), NOW,
                            set(), VictimIndex(view, NOW))
    assert chosen is not None
    assert [view.state.nodes[a.node].name for _, a in chosen.gang.allocs] == ["a"]
    assert sorted(r.workload.id for r in chosen.victims) == sorted(
        [f"a{i}" for i in range(7)] + [f"b{i}" for i in range(7)] + ["g", "k"])
