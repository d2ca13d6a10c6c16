"""A write answered by a follower wakes the leader's control loop at once (server/leader.py
`WakeRelay`, LISTEN/NOTIFY on PostgreSQL), instead of at the leader's next full pass."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpupool.server import pgtemp
from gpupool.server.db import Store
from gpupool.server.leader import Leadership, WakeRelay


@pytest.fixture
def store(postgres: pgtemp.TempPostgres) -> Iterator[Store]:
    opened = Store.open(postgres.create_database())
    try:
        yield opened
    finally:
        opened.close()


def test_a_follower_wake_reaches_the_leader_loop(store: Store) -> None:
    leader = Leadership(store, server_id="lead", lease_s=30.0, renew_s=5.0)
    follower = Leadership(store, server_id="follow", lease_s=30.0, renew_s=5.0)
    assert leader.round() and not follower.round()
    on_leader, on_follower = WakeRelay(store, leader), WakeRelay(store, follower)
    on_leader.start()
    on_follower.start()
    try:
        # the leader listens from its start: wait until its LISTEN is in place (one notify answered)
        for _ in range(100):
            on_follower.wake.set()  # a submission answered by the follower
            if on_leader.wake.wait(0.2):
                break
        assert on_leader.wake.is_set(), "the follower's write never woke the leader's loop"
        assert on_leader.received >= 1
    finally:
        on_leader.stop()
        on_follower.stop()
