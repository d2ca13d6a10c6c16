"""Each machine's block of the pod network, handed out from the store.

A machine that joins (a Ray node) gets one /19 of the pod network (agent/netns.py's slot) for its
pods' addresses; the row in `net_blocks` says which machine holds it. Two servers may hand blocks
out at once (PostgreSQL runs their transactions concurrently): the insert is the compare-and-set,
since `slot` and `node` are each unique, the loser's insert fails and it reads again. A block is
given back when its machine leaves; a later join of the same node takes its block over.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from gpupool.errors import ProviderError
from gpupool.server.db import Store
from gpupool.server.orm import NetBlockRow

ATTEMPTS = 64
"""Lost races tolerated in one assign (each loss means another server took a block meanwhile)."""


class StoreBlocks:
    """providers.base.NetworkBlocks on the server's store."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    def assign(self, node: str, machine: str, capacity: int) -> int:
        for _ in range(ATTEMPTS):
            try:
                return self._assign_once(node, machine, capacity)
            except IntegrityError:  # another server took that slot (or this node) meanwhile
                continue
        raise ProviderError(f"Could not hand node {node} a block of the pod network: {ATTEMPTS} attempts "
                            "lost to other servers' assignments.")

    def _assign_once(self, node: str, machine: str, capacity: int) -> int:
        with self.store.write() as session:
            row = session.scalar(select(NetBlockRow).where(NetBlockRow.node == node))
            if row is not None:
                if row.machine != machine:  # the node joined again: the block is its own still
                    taken = session.connection().execute(
                        update(NetBlockRow).where(NetBlockRow.slot == row.slot,
                                                  NetBlockRow.machine == row.machine)
                        .values(machine=machine, assigned_s=self.clock())).rowcount
                    if taken != 1:
                        raise IntegrityError("net_blocks", None, ValueError("changed meanwhile"))
                return row.slot
            slot = self._free_slot(set(session.scalars(select(NetBlockRow.slot))), capacity)
            session.add(NetBlockRow(slot=slot, node=node, machine=machine, assigned_s=self.clock()))
            session.flush()  # the compare-and-set: a slot or node taken meanwhile fails here
            return slot

    def _free_slot(self, taken: set[int], capacity: int) -> int:
        for slot in range(capacity):
            if slot not in taken:
                return slot
        raise ProviderError(f"The pod network holds {capacity} machine block(s), all in use; give "
                            "GPUPOOL_POD_NETWORK a larger network, or let a machine leave.")

    def release(self, node: str, machine: str) -> None:
        with self.store.write() as session:
            session.execute(delete(NetBlockRow).where(NetBlockRow.node == node,
                                                      NetBlockRow.machine == machine))

    def held(self) -> dict[str, int]:
        """node -> slot, as stored."""
        with self.store.read() as session:
            return {row.node: row.slot for row in session.scalars(select(NetBlockRow))}
