"""Which unfinished work runs in an image: `gpupool image rm` refuses while any does."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.core.model import WorkloadStatus
from gpupool.errors import Conflict
from gpupool.server.orm import WorkloadRow

UNFINISHED = (WorkloadStatus.PENDING.value, WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)
SHOWN = 5
"""Workload ids a refusal names (the count says how many more)."""


def users(session: Session, image: str, limit: int = SHOWN + 1) -> list[str]:
    """Up to `limit` ids of pending, admitted or running workloads whose spec names `image`."""
    query = (select(WorkloadRow.id)
             .where(WorkloadRow.status.in_(UNFINISHED), WorkloadRow.spec["image"].as_string() == image)
             .order_by(WorkloadRow.id).limit(limit))
    return list(session.scalars(query))


def refuse_if_used(session: Session, image: str, *, replacing: bool = False) -> None:
    """Conflict (HTTP 409) naming the work that still needs `image`: removing it would fail their
    pods at launch; `replacing` it would start them (the next attempt of a running one too) in a root
    filesystem they were not submitted for, holding their secrets."""
    found = users(session, image)
    if not found:
        return
    shown = ", ".join(found[:SHOWN]) + (" and more" if len(found) > SHOWN else "")
    if replacing:
        raise Conflict(f"Image {image!r} is in use by pending or running work ({shown}): replacing it would "
                       "start their pods in another root filesystem than the one they were submitted for; "
                       "import it under a new name, or wait for them to end.", image=image,
                       workloads=found[:SHOWN])
    raise Conflict(f"Image {image!r} is in use by pending or running work ({shown}): removing it would "
                   "make those pods fail at launch; wait for them to end or cancel them "
                   "(`gpupool cancel ID`), then remove it.", image=image, workloads=found[:SHOWN])
