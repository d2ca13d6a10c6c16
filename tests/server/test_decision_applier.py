"""The server applies a cycle's decisions through one exhaustive match (`Scheduler._apply`): a kind
it has no case for raises rather than being dropped silently."""

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
