"""`scheduling.topology_moves` on the running pool: a gang that started spread over two leaves is
moved into one, and the single-node work on that leaf moves to the node the gang left; both stop
(SIGTERM, to checkpoint) and start again at once on their new nodes, as a new attempt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fabric_pool import Pool

from gpupool.server.loops.control import ControlLoop

MOVES = ("scheduling: {placement: network-aware, backfill: true, topology_moves: true, "
         "topology_max_wait: 0s}\n")
LONG = {"runtime_estimate_s": 100_000, "checkpoint_interval_s": 600}


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    made = Pool(tmp_path, config=MOVES)
    yield made
    made.close()


def _submit(pool: Pool, replicas: int = 1, **extra: object) -> str:
    answer = pool.call("post", "/workloads", {"command": ["train"], "replicas": replicas,
                                              "resources": {"gpus": 2}, **extra}, pool.tenant)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _pods(pool: Pool, workload_id: str, attempt: int) -> dict[str, str]:
    """pod id -> node, of the pods the provider was asked to launch for that attempt."""
    prefix = f"{workload_id}-a{attempt}-"
    return {p: launch.node for p, launch in pool.provider.launched.items() if p.startswith(prefix)}


def _spread_gang(pool: Pool, **gang: object) -> tuple[str, dict[str, str]]:
    """Six single-node jobs fill every node but node00001 (leaf 0) and node00003 (leaf 1); then a
    2-node gang starts spread over those two. Returns the gang and each single job's node."""
    for node in ("node00001", "node00003"):
        assert pool.call("post", f"/nodes/{node}/cordon").status_code == 200
    singles = [_submit(pool, **LONG) for _ in range(6)]
    pool.loop.step()
    for node in ("node00001", "node00003"):
        assert pool.call("post", f"/nodes/{node}/uncordon").status_code == 200
    g = _submit(pool, replicas=2, **gang)
    pool.loop.step()
    assert sorted(_pods(pool, g, 1).values()) == ["node00001", "node00003"]
    return g, {s: next(iter(_pods(pool, s, 1).values())) for s in singles}


def test_a_spread_gang_is_moved_into_a_leaf_through_the_running_pool(pool: Pool) -> None:
    g, singles = _spread_gang(pool, **LONG)
    neighbour = next(s for s, node in singles.items() if node == "node00002")
    pool.now += 60.0
    _submit(pool)  # work that fits nowhere: a cycle runs, and moves come first in it
    pool.loop.step()
    assert set(pool.provider.stopped) >= {*_pods(pool, g, 1), *_pods(pool, neighbour, 1)}
    pool.loop.step()  # the stopped pods are seen gone; the new attempts start
    assert sorted(_pods(pool, g, 2).values()) == ["node00001", "node00002"]
    assert list(_pods(pool, neighbour, 2).values()) == ["node00003"]
    reasons = [reason for reason, _ in pool.events(g)]
    assert "moved_for_locality" in reasons
    moved = dict(pool.events(neighbour))["moved_for_locality"]
    assert moved.startswith(f"Moved to node00003 to make room for gang {g!r} inside one leaf.")
    assert pool.detail(g)["status"] in ("admitted", "running")
    others = set(singles) - {neighbour}
    assert all(not _pods(pool, s, 2) for s in others)  # nothing else moved
    pool.now += 120.0
    pool.loop.step()  # a full pass, with the audit of the kept view against the store
    keeper = pool.loop.scheduler.keeper
    assert keeper.drifts == 0 and not _pods(pool, g, 3)  # in one leaf now: it stays


def test_work_that_does_not_say_it_checkpoints_is_not_moved(pool: Pool) -> None:
    g, _ = _spread_gang(pool, runtime_estimate_s=100_000)  # the gang declares no checkpoints
    pool.now += 60.0
    _submit(pool)
    pool.loop.step()
    assert pool.provider.stopped == [] and not _pods(pool, g, 2)


def test_moves_are_off_by_default(tmp_path: Path) -> None:
    pool = Pool(tmp_path, config="scheduling: {placement: network-aware, topology_max_wait: 0s}\n")
    try:
        g, _ = _spread_gang(pool, **LONG)
        pool.now += 60.0
        _submit(pool)
        pool.loop.step()
        assert pool.provider.stopped == [] and not _pods(pool, g, 2)
    finally:
        pool.close()


def _moved_on_a_quiet_pool(pool: Pool) -> tuple[str, str, dict[str, str]]:
    """The spread gang, then a minute with nothing pending: the loop's full pass still runs the
    cycle and moves it. Returns the gang, the single job moved for it, and each single job's node."""
    g, singles = _spread_gang(pool, **LONG)
    neighbour = next(s for s, node in singles.items() if node == "node00002")
    pool.now += 60.0
    pool.loop.step()
    pool.loop.step()
    return g, neighbour, singles


def test_a_quiet_pool_moves_too(pool: Pool) -> None:
    g, neighbour, _ = _moved_on_a_quiet_pool(pool)
    assert sorted(_pods(pool, g, 2).values()) == ["node00001", "node00002"]
    assert list(_pods(pool, neighbour, 2).values()) == ["node00003"]


def test_moves_per_workload_are_counted_and_survive_a_restart(pool: Pool) -> None:
    g, neighbour, singles = _moved_on_a_quiet_pool(pool)
    moved_at = pool.now
    info = pool.loop.scheduler.info
    assert info[g].moves == info[neighbour].moves == 1 and info[neighbour].moved_s == moved_at
    restarted = ControlLoop(pool.rt)  # a new server process: what it knows comes from the store
    restarted.recovered = restarted.reconciler.recover()
    pool.now += 60.0
    restarted.step()
    again = restarted.scheduler.info
    assert again[g].moves == again[neighbour].moves == 1 and again[neighbour].moved_s == moved_at
    assert all(s not in again or again[s].moves == 0 for s in set(singles) - {neighbour})


def test_moves_off_congestion_are_counted_apart_and_survive_a_restart(pool: Pool) -> None:
    """The bound on congestion moves (`fabric.congestion_max_moves`) reads its count from the
    workload's `congestion_moved` events after a restart, apart from its moves for locality."""
    from gpupool.core.model import Reason
    from gpupool.server.orm import EventRow

    g, neighbour, _ = _moved_on_a_quiet_pool(pool)
    with pool.rt.store.write() as session:
        for at in (pool.now + 1.0, pool.now + 2.0):
            session.add(EventRow(workload_id=g, pod_id="", from_status="running", to_status="pending",
                                 reason=Reason.CONGESTION_MOVED.value, message="moved", at_s=at))
    restarted = ControlLoop(pool.rt)
    restarted.recovered = restarted.reconciler.recover()
    pool.now += 60.0
    restarted.step()
    again = restarted.scheduler.info
    assert (again[g].moves, again[g].congestion_moves) == (1, 2)
    assert (again[neighbour].moves, again[neighbour].congestion_moves) == (1, 0)
