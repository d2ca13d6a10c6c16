"""The control loop's rest after it handed launches over: it lasts while the launches keep coming
back (so the pod exits and submissions of that time are decided in one cycle and the batch is
recorded at once), and ends when one under way has taken LAUNCH_SLOW_S (a node that hangs)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from test_launch_workers import PATIENCE_S, Pool, step_bounded

from clocks import HeldClock
from gpupool.server.loops import control, launches

GAP_S = 0.4
"""How long each launch takes, on the clock below: well under LAUNCH_SLOW_S, six of them beyond."""


@pytest.fixture
def pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pool:
    monkeypatch.setattr(control, "LAUNCH_SLOW_S", 1.5)
    monkeypatch.setattr(control, "LAUNCH_REST_MAX_S", PATIENCE_S)
    made = Pool(tmp_path, nodes="1x8xH100")
    made.provider.gated.update(n.name for n in made.provider.nodes())
    made.loop.scheduler.launches.per_node = 1  # one launch at a time: they come back one by one
    return made


def test_the_rest_lasts_while_launches_come_back_one_after_another(
        pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Six launches come back GAP_S apart (2.4 s in all, beyond LAUNCH_SLOW_S): the rest ends only
    once the last is back, and the next step records all six in one go."""
    clock = HeldClock()
    monkeypatch.setattr(control, "time", clock)
    monkeypatch.setattr(launches, "time", clock)
    ids = [pool.submit(1) for _ in range(6)]
    pool.loop._launched.clear()
    step_bounded(pool.loop)  # admits the six and hands their launches over
    provider, under_way = pool.provider, pool.loop.scheduler.launches
    assert under_way.launching

    def release_one_by_one() -> None:
        for _ in ids:
            deadline = time.monotonic() + PATIENCE_S
            while len(provider.blocked) <= len(provider.released) and time.monotonic() < deadline:
                time.sleep(0.005)  # the next launch has not reached the provider yet
            clock.now += GAP_S
            provider.released.add(provider.blocked[len(provider.released)])

    releaser = threading.Thread(target=release_one_by_one, daemon=True)
    releaser.start()
    pool.loop._launch_rest()
    assert not under_way.launching, "the rest ended while launches were still coming back"
    releaser.join(PATIENCE_S)
    assert pool.loop.scheduler.record_launches() == 6
    assert {pool.row(i).status for i in ids} == {"running"}


def test_the_rest_ends_when_no_launch_comes_back(pool: Pool) -> None:
    """A node that hangs holds the loop for LAUNCH_SLOW_S, not until its launches' deadline."""
    pool.submit(1)
    pool.loop._launched.clear()
    step_bounded(pool.loop)
    try:
        rest = threading.Thread(target=pool.loop._launch_rest, daemon=True)
        rest.start()
        rest.join(PATIENCE_S)
        assert not rest.is_alive(), "the rest waited on a hung launch"
        assert pool.loop.scheduler.launches.launching  # the launch still hangs
    finally:
        pool.provider.gate.set()
