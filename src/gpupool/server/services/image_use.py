"""Which unfinished work and which services run in an image: `gpupool image rm` and an import under
its name refuse while any does."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.core.model import WorkloadStatus
from gpupool.errors import Conflict
from gpupool.server.orm import ServiceRow, WorkloadRow

UNFINISHED = (WorkloadStatus.PENDING.value, WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)
SHOWN = 5
"""Workload ids a refusal names (the count says how many more)."""


def users(session: Session, image: str, limit: int = SHOWN + 1) -> list[str]:
    """Up to `limit` ids of pending, admitted or running workloads whose spec names `image`."""
    query = (select(WorkloadRow.id)
             .where(WorkloadRow.status.in_(UNFINISHED), WorkloadRow.spec["image"].as_string() == image)
             .order_by(WorkloadRow.id).limit(limit))
    return list(session.scalars(query))


def services(session: Session, image: str, limit: int = SHOWN + 1) -> list[str]:
    """Up to `limit` services (TENANT/NAME) whose spec names `image`: each starts replicas in it
    whenever it scales up or rolls, at zero replicas too."""
    query = (select(ServiceRow.tenant, ServiceRow.name).where(ServiceRow.spec["image"].as_string() == image)
             .order_by(ServiceRow.tenant, ServiceRow.name).limit(limit))
    return [f"{tenant}/{name}" for tenant, name in session.execute(query)]


def refuse_if_used(session: Session, image: str, *, replacing: bool = False) -> None:
    """Conflict (HTTP 409) naming the work and the services that still need `image`: removing it
    would fail their pods at launch; `replacing` it would start them (the next attempt of a running
    one, a service's next replica) in a root filesystem they were not submitted for, holding their
    secrets."""
    found, served = users(session, image), services(session, image)
    if not found and not served:
        return
    what = []
    if found:
        what.append("pending or running work (" + ", ".join(found[:SHOWN])
                    + (" and more" if len(found) > SHOWN else "") + ")")
    if served:
        what.append("services (" + ", ".join(served[:SHOWN]) + (" and more" if len(served) > SHOWN else "")
                    + ")")
    users_text = " and ".join(what)
    wait = ("wait for the work to end or cancel it (`gpupool cancel ID`)" if found else "")
    delete = ("delete the services or give them another image (`gpupool service update NAME -f FILE`, "
              "its `image:` another)" if served else "")
    then = "; ".join(x for x in (wait, delete) if x)
    if replacing:
        raise Conflict(f"Image {image!r} is in use by {users_text}: replacing it would start their pods in "
                       "another root filesystem than the one they were submitted for; import it under a new "
                       f"name, or {then} first.", image=image, workloads=found[:SHOWN],
                       services=served[:SHOWN])
    raise Conflict(f"Image {image!r} is in use by {users_text}: removing it would make those pods fail at "
                   f"launch; {then}, then remove it.", image=image, workloads=found[:SHOWN],
                   services=served[:SHOWN])
