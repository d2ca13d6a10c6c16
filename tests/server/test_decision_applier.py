"""The server applies a cycle's decisions through one exhaustive match (`DecisionApplier._apply`): a
kind it has no case for raises rather than being dropped silently."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fabric_pool import Pool

from gpupool.core.scheduling.cycle import CycleResult


@dataclass(frozen=True, slots=True)
class Bogus:
    """A kind of decision the server has no case for (as one added to the core and forgotten here)."""

    workload_id: str


def test_a_decision_the_server_cannot_apply_raises_instead_of_being_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = Pool(tmp_path, fabric=False)
    try:
        answer = pool.call("post", "/workloads", {"command": ["train"], "resources": {"gpus": 1}})
        assert answer.status_code == 201, answer.text
        wid = answer.json()["id"]
        scheduler = pool.loop.scheduler
        cycle = scheduler.keeper.cycle

        def with_bogus(*args: Any, **kwargs: Any) -> CycleResult:
            return CycleResult((*cycle(*args, **kwargs).decisions, Bogus(wid)))  # type: ignore[arg-type]

        monkeypatch.setattr(scheduler.keeper, "cycle", with_bogus)
        with pytest.raises(TypeError, match="No applier case for the decision Bogus"):
            scheduler.cycle()
        monkeypatch.undo()
        scheduler.cycle()  # the real kinds alone: applied
        assert pool.detail(wid)["status"] in ("admitted", "running")
    finally:
        pool.close()


def test_the_moves_of_a_cycle_are_written_in_one_transaction() -> None:
    # one move takes the devices another leaves: split over two transactions, the second's stop
    # would come after the first's admission had found its devices free
    from gpupool.core.model import Reason
    from gpupool.core.scheduling.cycle import EventKind, Stop, Wait
    from gpupool.server.loops.scheduler import chunked

    def move(wid: str) -> Stop:
        return Stop(wid, EventKind.MOVE, Reason.MOVED_FOR_LOCALITY, "Moved.", gang_id="g")

    evict = Stop("e", EventKind.EVICT, Reason.EVICTED_UNHEALTHY, "Evicted.", grace=False)
    waits = [Wait(f"w{i}", Reason.NO_NODE_FITS, "No node fits.") for i in range(5)]
    items = [evict, move("a"), move("b"), move("g"), *waits]
    chunks = [[d.workload_id for d in chunk] for chunk in chunked(items, 2)]
    assert chunks == [["e", "a", "b", "g"], ["w0", "w1"], ["w2", "w3"], ["w4"]]
    assert [d for chunk in chunked(items, 3) for d in chunk] == items
