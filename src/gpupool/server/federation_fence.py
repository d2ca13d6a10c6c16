"""A federation member's fence against a silent hub (docs/federation.md).

A hub that stops hearing from a member moves the member's work elsewhere: its pending copies at
once, its running ones after the hub's requeue_grace_s. A member cut off from its hub (a partition:
both sides up) would otherwise go on running the copies the hub has placed again, so the same work
runs twice until the hub reaches it. With `federation.fence` set, a pool that has had no call from a
federation token for that long holds the hub's pending copies and stops and holds its running ones
(requeued, held; their checkpoints stay). The hub's requeue_grace_s is longer than the fence (the
hub checks at start), so a copy is stopped here before the hub starts it elsewhere; when the hub
answers again it releases the copies it still places here and cancels the others.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import ColumnElement, Text, cast, select

from gpupool.api.events import EventReason
from gpupool.core.model import WorkloadStatus
from gpupool.server.auth import FEDERATION_ID_ENV
from gpupool.server.orm import WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.events import transition
from gpupool.server.services.requeue import requeue as requeue_row
from gpupool.server.services.requeue import stop_after_commit

log = logging.getLogger("gpupool.federation")

CHECK_EVERY_S = 0.5
"""While fenced, how often the store is read for copies that started meanwhile."""
_ACTIVE = (WorkloadStatus.PENDING.value, WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)


def names_federation_id() -> ColumnElement[bool]:
    """Workload rows whose spec names FEDERATION_ID_ENV anywhere: a read of a hub's copies narrowed
    by the text (and so locked only where it may be one); each row's env then decides."""
    return cast(WorkloadRow.spec, Text).contains(FEDERATION_ID_ENV, autoescape=True)


class Fence:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.fence_s = rt.config.federation.fence
        self._next_check = 0.0

    def silent_s(self) -> float:
        return time.monotonic() - self.rt.auth.federation_heard_s

    def check(self) -> int:
        """Hold (and stop) the hub's copies when the hub has been silent past the fence; returns how
        many changed. Cheap when there is no fence or the hub was heard from."""
        if self.fence_s is None:
            return 0
        silent = self.silent_s()
        now_m = time.monotonic()
        if silent < self.fence_s or now_m < self._next_check:
            return 0
        self._next_check = now_m + CHECK_EVERY_S
        now = self.rt.clock()
        to_stop: list[str] = []
        fenced = 0
        why = (f"The federation hub has not called for {silent:.0f} s (federation.fence "
               f"{self.fence_s:g} s) and may run this work elsewhere: held until it answers.")
        with self.rt.store.write() as session:
            # Locked as read, in id order: a cancel or a release committed meanwhile is waited for and
            # its row read again (then no longer active, or held), never overwritten with a hold
            rows = session.scalars(select(WorkloadRow).where(
                WorkloadRow.status.in_(_ACTIVE), WorkloadRow.held == "", names_federation_id())
                .order_by(WorkloadRow.id).with_for_update()).all()
            for row in rows:
                if FEDERATION_ID_ENV not in (row.spec.get("env") or {}):
                    continue
                if row.status != WorkloadStatus.PENDING.value:
                    to_stop += requeue_row(session, row, EventReason.FEDERATION_FENCED.value,
                                           "Stopped: " + why, now)
                row.held = "user"
                transition(session, row, WorkloadStatus.PENDING.value, EventReason.FEDERATION_FENCED, why,
                           now)
                fenced += 1
        if to_stop:
            stop_after_commit(self.rt, to_stop, now)
        if fenced:
            log.warning("fenced %d federated workload(s): no call from the hub for %.0f s", fenced, silent)
            self.rt.capacity_may_have_changed()
        return fenced
