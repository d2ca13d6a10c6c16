"""Whether a gang can ever fit the pool (cycle.py `_never_fits`): without a fabric, a gang each of
whose pods fits on as many nodes of the empty pool as the gang has pods is taken as fitting without
a trial placement; the rest are placed on an empty pool to find out (and to word why not)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from factories import node, pod, workload
from gpupool.core.model import Allocation, ClusterSnapshot, Reason, Workload
from gpupool.core.scheduling import cycle
from gpupool.core.scheduling.cycle import Policies, Refuse, run_cycle
from gpupool.core.scheduling.gang import GangPlacement, place_gang
from gpupool.core.scheduling.policies.base import make_policy, policy_names
from gpupool.core.state import ClusterState, clone_state

MODELS = ("H100", "A100")


def _pool(rng: random.Random) -> list:
    return [node(f"n{i}", devices=rng.choice((1, 2, 4, 8)), model=rng.choice(MODELS),
                 cpu_milli=rng.choice((8_000, 32_000, 96_000)), memory_mib=rng.choice((65_536, 524_288)))
            for i in range(rng.randint(3, 12))]


def _gang(rng: random.Random) -> Workload:
    shapes = [pod(rng.choice((0.25, 0.5, 1, 2, 3, 4, 8)), cpu_milli=rng.choice((1_000, 8_000, 40_000)),
                  memory_mib=rng.randint(1_024, 100_000),
                  models=frozenset(rng.sample(MODELS, 1)) if rng.random() < 0.3 else frozenset())
              for _ in range(rng.randint(1, 3))]
    return workload(*(replace(shapes[i % len(shapes)], name=f"p{i}") for i in range(rng.randint(2, 5))))


def _counted_fit(w: Workload, state: ClusterState) -> bool:
    return all(int(state.node_fits(p).sum()) >= len(w.pods) for p in w.pods)


@pytest.mark.parametrize("name", policy_names())
def test_a_gang_each_of_whose_pods_fits_as_many_empty_nodes_as_it_has_pods_is_placed(name: str) -> None:
    rng = random.Random(name)
    proven = tight = 0
    for _ in range(300):
        nodes = _pool(rng)
        w = _gang(rng)
        state = ClusterState(nodes)
        if not _counted_fit(w, state):
            continue
        proven += 1
        tight += any(int(state.node_fits(p).sum()) == len(w.pods) for p in w.pods)
        placed = place_gang(w, state, make_policy(name), random.Random(0))
        assert isinstance(placed, GangPlacement), (name, w, nodes)
    assert proven >= 40 and tight >= 5  # and some with just as many nodes as pods


def test_thousands_of_gang_shapes_take_no_trial_placement_and_a_gang_that_never_fits_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = [node(f"n{i}", devices=8, model="H100") for i in range(16)]
    filler = [workload(pod(8), wid=f"f{i}") for i in range(16)]  # the pool is full
    first = run_cycle(ClusterSnapshot(tuple(nodes)), filler, Policies(), 0.0, random.Random(0))
    running = tuple(Allocation(filler[int(a.workload_id[1:])], a.placements, 0.0) for a in first.admitted)
    assert len(running) == 16
    gangs = [workload(*(pod(5, memory_mib=16_384 + i, name=f"p{k}") for k in range(2)), wid=f"g{i}")
             for i in range(300)]
    never = workload(*(pod(8, name=f"p{k}") for k in range(17)), wid="never")  # 17 whole nodes of 16
    empty: list[ClusterState] = []
    trials: list[str] = []

    def cloned(state: ClusterState, **options: object) -> ClusterState:
        made = clone_state(state, **options)  # type: ignore[arg-type]
        if options.get("empty"):
            empty.append(made)
        return made

    def counted(w: Workload, state: ClusterState, *args: object) -> object:
        if any(state is e for e in empty):  # a trial on the empty pool
            trials.append(w.id)
        return place_gang(w, state, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(cycle, "clone_state", cloned)
    monkeypatch.setattr(cycle, "place_gang", counted)
    pool = ClusterSnapshot(tuple(nodes), running)
    result = run_cycle(pool, [*gangs, never], Policies(), 1.0, random.Random(0))
    assert trials == ["never"]
    refused = [d for d in result.decisions if isinstance(d, Refuse)]
    assert [(d.workload_id, d.reason) for d in refused] == [("never", Reason.NEVER_FITS)]
    assert "can never fit this pool" in refused[0].message


def test_work_that_only_a_cordoned_node_or_one_with_a_failed_device_holds_waits_and_the_rest_is_refused(
) -> None:
    """Whether work can ever fit is judged on the pool as built: a cordoned node, or a node with a
    failed device, comes back (uncordoned, repaired), so work only it could hold waits for it with a
    reason that is not final; work no node could hold even then is refused, whatever is cordoned."""
    big = node("big", devices=8, model="H100")
    small = node("small", devices=2, model="H100")
    eight, nine = workload(pod(8), wid="eight"), workload(pod(9), wid="nine")
    cordoned = replace(big, cordoned=True)
    failed = replace(big, devices=(replace(big.devices[0], healthy=False), *big.devices[1:]))
    for pool in ((cordoned, small), (failed, small), (cordoned, replace(small, cordoned=True))):
        result = run_cycle(ClusterSnapshot(pool), [eight, nine], Policies(), 0.0, random.Random(0))
        verdicts = {d.workload_id: d for d in result.decisions}
        assert not isinstance(verdicts["eight"], Refuse), (pool, verdicts["eight"])
        assert verdicts["eight"].reason is not Reason.NEVER_FITS
        assert isinstance(verdicts["nine"], Refuse) and verdicts["nine"].reason is Reason.NEVER_FITS
    result = run_cycle(ClusterSnapshot((big, small)), [eight], Policies(), 0.0, random.Random(0))
    assert [a.workload_id for a in result.admitted] == ["eight"]  # and it runs there once it is back
