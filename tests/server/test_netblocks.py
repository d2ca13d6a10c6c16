"""Each joining machine's block of the pod network, handed out from the store: two joins never get
the same block, a leave frees it, a node joining again keeps its own, and servers racing to hand
blocks out (two stores on one database, PostgreSQL running their transactions at once) never give
one block twice."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from gpupool.errors import ProviderError
from gpupool.server.db import Store
from gpupool.server.orm import NetBlockRow
from gpupool.server.services.netblocks import StoreBlocks

CAPACITY = 32


@pytest.fixture
def store(db_url: str) -> Store:
    return Store.open(db_url)


def test_two_joins_never_share_a_block_and_a_leave_frees_it(store: Store) -> None:
    blocks = StoreBlocks(store)
    a = blocks.assign("a", "ray-a", CAPACITY)
    b = blocks.assign("b", "ray-b", CAPACITY)
    assert a != b
    assert blocks.assign("a", "ray-a", CAPACITY) == a  # asked again: the same
    assert blocks.held() == {"a": a, "b": b}
    blocks.release("a", "ray-a")
    assert blocks.held() == {"b": b}
    assert blocks.assign("c", "ray-c", CAPACITY) == a  # the freed block goes to the next join


def test_a_node_joining_again_keeps_its_block_and_the_old_join_cannot_free_it(store: Store) -> None:
    blocks = StoreBlocks(store)
    blocks.assign("x", "ray-x0", CAPACITY)
    b = blocks.assign("b", "ray-b", CAPACITY)
    assert blocks.assign("b", "ray-b2", CAPACITY) == b  # b joined again (a new Ray node id)
    blocks.release("b", "ray-b")  # the old join's leave, seen late
    assert blocks.held()["b"] == b
    blocks.release("b", "ray-b2")
    assert "b" not in blocks.held()


def test_a_full_pod_network_refuses_with_the_setting_to_change(store: Store) -> None:
    blocks = StoreBlocks(store)
    blocks.assign("a", "ray-a", 1)
    with pytest.raises(ProviderError, match="GPUPOOL_POD_NETWORK a larger network"):
        blocks.assign("b", "ray-b", 1)


def test_a_lost_race_reads_again_and_takes_another_block(db_url: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The compare-and-set itself: server A reads slot 0 as free, server B takes it before A
    writes; A's insert fails on the unique slot and A takes slot 1."""
    first, second = Store.open(db_url), Store.open(db_url)
    a, b = StoreBlocks(first), StoreBlocks(second)
    original = StoreBlocks._free_slot
    raced: list[int] = []

    def free_slot_then_lose_it(self: StoreBlocks, taken: set[int], capacity: int) -> int:
        slot = original(self, taken, capacity)
        if self is a and not raced:  # B takes the same slot between A's read and A's write
            raced.append(b.assign("b", "ray-b", capacity))
        return slot

    monkeypatch.setattr(StoreBlocks, "_free_slot", free_slot_then_lose_it)
    got = a.assign("a", "ray-a", CAPACITY)
    assert raced == [0] and got == 1
    with second.read() as session:
        rows = {row.node: row.slot for row in session.scalars(select(NetBlockRow))}
    assert rows == {"a": 1, "b": 0}


def test_concurrent_joins_through_two_servers_get_distinct_blocks(db_url: str) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("one SQLite store serves one server; concurrent servers need PostgreSQL")
    stores = [Store.open(db_url), Store.open(db_url)]
    start = threading.Barrier(16)
    got: dict[str, int] = {}
    errors: list[BaseException] = []

    def join(i: int) -> None:
        blocks = StoreBlocks(stores[i % 2])
        start.wait()
        try:
            got[f"n{i}"] = blocks.assign(f"n{i}", f"ray-{i}", CAPACITY)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(got.values()) == list(range(16))  # sixteen joins, sixteen distinct blocks
    assert StoreBlocks(stores[0]).held() == got
