"""The federation hub: takes tenants' work, offers it to member pools, and keeps the one true record
of where each workload runs (docs/federation.md).

Dispatch is MultiKueue's: a workload is offered to the ranked members in order and the first whose
admission takes it keeps it; a member's refusal passes it to the next. Every change of the hub's
record is a compare-and-set on its version, and a copy the hub gave up (its member went silent and
the work was placed again elsewhere) is cancelled on that member as soon as it answers again: the
hub's record wins, so a workload never runs in two members for longer than it takes to see the
member again. Each copy carries the hub's id in its environment (FEDERATION_ID_ENV), so a copy whose
creation answer was lost is found on the member and adopted or cancelled.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import delete, func, select, update

from gpupool.api.workloads import STORED, WorkloadSpec, WorkloadUpdate, set_spec_field
from gpupool.errors import (
    Conflict,
    GpupoolError,
    InvalidInput,
    NotFound,
    QuotaExceeded,
    TooManyPending,
    Unavailable,
)
from gpupool.federation.config import FederationConfig
from gpupool.federation.members import MemberLink, MemberUnreachable
from gpupool.federation.placement import candidates, reoffer_target
from gpupool.server.auth import FEDERATION_ID_ENV, Principal
from gpupool.server.db import Store
from gpupool.server.orm import FedCheckpointRow, FedEventRow, FedPlacementRow, FedWorkloadRow
from gpupool.server.services.tokens import lock_tenant

log = logging.getLogger("gpupool.federation")

ACTIVE = ("queued", "placed")
ENDED = ("succeeded", "failed", "cancelled")
BEFORE_START = ("pending", "admitted")


def new_id() -> str:
    return "f-" + secrets.token_hex(6)


class Hub:
    """The hub's state and its two threads: the dispatcher (offers queued work) and the monitor (polls
    members, follows placed work, moves the work of a silent member, cancels stale copies)."""

    def __init__(self, store: Store, config: FederationConfig,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.links = [MemberLink(member, clock=clock) for member in config.members]
        self.by_name = {link.name: link for link in self.links}
        self.wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last_refusal: dict[str, str] = {}

    # ------------------------------------------------------------ lifetime

    def first_poll(self) -> list[str]:
        """Poll every member once; a sentence for each that does not answer (the hub starts anyway)."""
        now = self.clock()
        notices = []
        for link in self.links:
            link.poll(now, self.config.member_down_after_s)
            if not link.state.up:
                notices.append(f"Member {link.state.note}, so it is marked down; the hub starts "
                               "without it and offers it work once it answers.")
        fences = {link.name: fence for link in self.links if (fence := link.fence_s()) is not None
                  and fence >= self.config.requeue_grace_s}
        if fences:
            raise InvalidInput(
                f"requeue_grace_s ({self.config.requeue_grace_s:g} s) must be longer than each member's "
                f"federation.fence, or a member cut off from the hub could still run a copy the hub has "
                f"started elsewhere; {', '.join(f'{n} fences after {f:g} s' for n, f in fences.items())}: "
                "raise requeue_grace_s in the federation file or lower the members' fence.")
        return notices

    def start(self) -> None:
        for target, name in ((self._dispatch_loop, "fed-dispatch"), (self._monitor_loop, "fed-monitor")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self.wake.set()
        for thread in self._threads:
            thread.join(timeout=10)
        for link in self.links:
            link.close()

    # ------------------------------------------------------------ tenants' acts

    def submit(self, who: Principal, spec: WorkloadSpec) -> str:
        tenant = who.tenant_for(spec.tenant)
        if spec.array is not None or spec.dependency is not None:  # ids a member would read as its own
            raise InvalidInput(f"A federation hub does not take {'arrays' if spec.array else 'dependencies'} "
                               "yet; submit it to a member pool directly, or as separate workloads.")
        if spec.on_behalf is not None:  # a member sets it (the hub's token acts for the tenant there)
            raise InvalidInput("on_behalf is set by a member pool on work a hub submits; leave it out.",
                               field="on_behalf")
        spec = spec.model_copy(update={"tenant": None})
        gpus = float(spec.replicas) * float(spec.resources.gpus)
        limit = self.config.tenants.get(tenant)
        now = self.clock()
        workload_id = new_id()
        with self.store.write() as session:
            tenant_row = lock_tenant(session, tenant)  # one tenant's submissions counted one after another
            waiting = session.scalar(select(func.count()).where(
                FedWorkloadRow.tenant == tenant, FedWorkloadRow.state.in_(ACTIVE),
                FedWorkloadRow.status == "pending")) or 0
            if waiting >= tenant_row.max_pending:  # a flood from one tenant must not stall the hub's dispatch
                raise TooManyPending(
                    f"Tenant {tenant!r} already has {waiting} workloads waiting at the hub, its limit "
                    f"({tenant_row.max_pending}); submit more once some have started.", tenant=tenant)
            if limit is not None and limit.max_gpus is not None:
                held = session.scalar(select(func.coalesce(func.sum(FedWorkloadRow.gpus), 0.0)).where(
                    FedWorkloadRow.tenant == tenant, FedWorkloadRow.state.in_(ACTIVE))) or 0.0
                if held + gpus > limit.max_gpus:
                    raise QuotaExceeded(
                        f"Tenant {tenant!r} may hold {limit.max_gpus:g} GPUs across the federation and its "
                        f"unfinished work asks for {held:g}; this asks for {gpus:g} more. Wait for some to "
                        "end or cancel some (gpupool ls).", tenant=tenant)
            session.add(FedWorkloadRow(id=workload_id, tenant=tenant, spec=spec.model_dump(mode="json"),
                                       gpus=gpus, state="queued", member=None, member_id=None,
                                       status="pending",
                                       view=None, moves=0, version=0, submit_s=now, updated_s=now))
            session.add(FedEventRow(workload_id=workload_id, reason="federation_submitted",
                                    message=f"taken by the hub for tenant {tenant}", at_s=now))
        self.wake.set()
        return workload_id

    def row(self, who: Principal, workload_id: str) -> FedWorkloadRow:
        with self.store.read() as session:
            row = session.get(FedWorkloadRow, workload_id)
            if row is None or not who.may_see(row.tenant):
                raise NotFound(f"No workload {workload_id!r} at this hub; `gpupool ls` lists yours.",
                               workload_id=workload_id)
            session.expunge(row)
            return row

    def cancel(self, who: Principal, workload_id: str) -> FedWorkloadRow:
        for _ in range(20):
            row = self.row(who, workload_id)
            if row.state not in ACTIVE:
                return row
            if self._cas(row, state="cancelled", status="cancelled"):
                self._drop_checkpoint(row.id)
                self._event(row.id, "federation_cancelled", f"cancelled by {who.actor}")
                if row.member and row.member_id:
                    self._mark_stale(row, "cancelled at the hub")
                    self._withdraw(row.tenant, row.member, row.member_id)
                return self.row(who, workload_id)
        raise GpupoolError(f"Workload {workload_id!r} kept changing while it was cancelled; try again.")

    def control(self, who: Principal, workload_id: str, act: str, *, hold_after: bool = False,
                change: dict[str, Any] | None = None) -> tuple[FedWorkloadRow, Any]:
        """`act` (hold, release, requeue or update) on a workload, forwarded to the member holding it
        under the hub's id; the hub's record first (compare-and-set on its version), so its watch
        neither offers a held workload nor releases the member's held copy. Returns the record and
        the member's answer (None when no member holds it: the act was the hub's alone)."""
        kind = "admin" if who.is_admin else "user"
        for _ in range(20):
            row = self.row(who, workload_id)
            if row.state not in ACTIVE:
                raise Conflict(f"Workload {workload_id!r} has ended ({row.status}); nothing to {act}.",
                               workload_id=workload_id)
            if act == "release" and row.held == "admin" and not who.is_admin:
                raise Conflict(f"Workload {workload_id!r} was held by the admin; only the admin releases it.",
                               workload_id=workload_id)
            held = {"hold": kind, "release": "",
                    "requeue": kind if hold_after else row.held}.get(act, row.held)
            if row.state == "queued" and act in ("update", "requeue"):
                raise Conflict(f"Workload {workload_id!r} waits at the hub and is on no member yet, so it "
                               f"cannot be {'updated' if act == 'update' else 'requeued'}; cancel it and "
                               "submit it again with the change, or wait until a member holds it.",
                               workload_id=workload_id)
            if not self._cas(row, held=held):
                continue
            if row.state == "queued":
                self._event(row.id, f"federation_{act}", f"{act} at the hub by {who.actor}")
                self.wake.set()
                return self.row(who, workload_id), None
            answer = self._forward_act(row, act, hold_after, change)
            fresh = self.row(who, workload_id)
            if answer.status_code != 200:  # the member refused: the record says what it said before
                self._set_held(row.id, row.held)
                return self.row(who, workload_id), answer
            view = dict(answer.json())
            values: dict[str, Any] = {"status": str(view["status"]), "view": view}
            if act == "update":  # a later move re-offers the changed spec
                # the hub's own spec with the change it forwarded (and validated), never the member's
                # copy: a member answers what it likes, and its spec would then run on other members
                spec = dict(fresh.spec)
                for field, value in WorkloadUpdate.model_validate(change or {}).fields():
                    set_spec_field(spec, field, value)
                values["spec"] = spec
                values["gpus"] = (float(spec.get("replicas", 1))
                                  * float(spec.get("resources", {}).get("gpus", 0)))
            self._cas(fresh, **values)  # lost to the watch's newer read: it reads the member again
            self._event(row.id, f"federation_{act}", f"{act} by {who.actor}, forwarded to {row.member} "
                        f"({row.member_id})")
            return self.row(who, workload_id), answer
        raise GpupoolError(f"Workload {workload_id!r} kept changing during {act}; try again.")

    def _forward_act(self, row: FedWorkloadRow, act: str, hold_after: bool,
                     change: dict[str, Any] | None) -> Any:
        link = self.by_name[row.member or ""]
        try:
            if act == "update":
                return link.call("PATCH", f"/workloads/{row.member_id}", tenant=row.tenant, json=change or {})
            return link.call("POST", f"/workloads/{row.member_id}/{act}", tenant=row.tenant,
                             params={"hold": "true"} if act == "requeue" and hold_after else None)
        except MemberUnreachable as exc:
            self._set_held(row.id, row.held)
            raise Unavailable(f"The member holding {row.id} does not answer now ({exc}); "
                              "try again later.") from None

    def _held_now(self, workload_id: str) -> bool:
        with self.store.read() as session:
            return bool(session.scalar(select(FedWorkloadRow.held).where(FedWorkloadRow.id == workload_id)))

    def _set_held(self, workload_id: str, held: str) -> None:
        """Put the record's hold back (compare-and-set, read again while the watch writes meanwhile)."""
        for _ in range(20):
            with self.store.read() as session:
                row = session.get(FedWorkloadRow, workload_id)
                if row is None or row.held == held:
                    return
                session.expunge(row)
            if self._cas(row, held=held):
                return
        log.warning("%s: its hold could not be put back to %r", workload_id, held)

    def fresh_view(self, row: FedWorkloadRow) -> dict[str, Any] | None:
        """The member's copy now (falls back on the last one read when the member is silent)."""
        link = self.by_name.get(row.member or "")
        if link is None or not row.member_id or not link.state.up:
            return row.view
        try:
            answer = link.call("GET", f"/workloads/{row.member_id}", tenant=row.tenant)
        except MemberUnreachable:
            return row.view
        return dict(answer.json()) if answer.status_code == 200 else row.view

    def events(self, workload_id: str) -> list[FedEventRow]:
        with self.store.read() as session:
            rows = list(session.scalars(select(FedEventRow).where(FedEventRow.workload_id == workload_id)
                                        .order_by(FedEventRow.id)))
            session.expunge_all()
            return rows

    # ------------------------------------------------------------ store helpers

    def _cas(self, row: FedWorkloadRow, **values: Any) -> bool:
        """Write `values` over `row` only if nobody changed it since it was read."""
        with self.store.write() as session:
            result = session.execute(
                update(FedWorkloadRow).where(FedWorkloadRow.id == row.id,
                                             FedWorkloadRow.version == row.version)
                .values(version=row.version + 1, updated_s=self.clock(), **values))
            return bool(getattr(result, "rowcount", 0))

    def _event(self, workload_id: str, reason: str, message: str) -> None:
        with self.store.write() as session:
            session.add(FedEventRow(workload_id=workload_id, reason=reason, message=message,
                                    at_s=self.clock()))
        log.info("%s %s: %s", workload_id, reason, message)

    def _mark_stale(self, row: FedWorkloadRow, why: str) -> None:
        with self.store.write() as session:
            session.execute(update(FedPlacementRow).where(
                FedPlacementRow.workload_id == row.id, FedPlacementRow.member == row.member,
                FedPlacementRow.member_id == (row.member_id or ""), FedPlacementRow.state == "current")
                .values(state="stale"))
        del why

    def _rows(self, *states: str) -> list[FedWorkloadRow]:
        with self.store.read() as session:
            rows = list(session.scalars(select(FedWorkloadRow).where(FedWorkloadRow.state.in_(states))
                                        .order_by(FedWorkloadRow.submit_s).limit(1000)))
            session.expunge_all()
            return rows

    # ------------------------------------------------------------ dispatch

    def _dispatch_loop(self) -> None:
        while not self._stop.is_set():
            self.wake.wait(self.config.poll_interval_s)
            self.wake.clear()
            try:
                for row in self._rows("queued"):
                    if self._stop.is_set():
                        return
                    self.offer(row)
            except Exception:  # one bad round must not end the hub's dispatching
                log.exception("dispatch round failed")

    def offer(self, row: FedWorkloadRow) -> str | None:
        """Offer a queued workload to its candidates in order; the member that keeps it, or None."""
        if row.held:  # held at the hub: offered once released
            return None
        if self._unresolved_offer(row):
            return None
        spec = WorkloadSpec.model_validate(row.spec, context=STORED)
        ranked = candidates(self.config, self.links, row.tenant, spec, self.clock())
        order = ranked.members
        if not order:
            why = "; ".join(ranked.refused)
            if why != self._last_refusal.get(row.id):  # said once, not every round
                self._last_refusal[row.id] = why
                self._event(row.id, "federation_unplaceable",
                            f"no member can take it under {ranked.policy}: {why}")
            return None
        body = {**row.spec, "env": {**row.spec.get("env", {}), FEDERATION_ID_ENV: row.id}}
        carried = self._checkpoint(row.id)
        refusals = []
        for name in order:
            link = self.by_name[name]
            with self.store.write() as session:  # the offer is recorded before it is made
                offer = FedPlacementRow(workload_id=row.id, tenant=row.tenant, member=name, member_id="",
                                        state="offered", at_s=self.clock())
                session.add(offer)
                session.flush()
                offer_id = offer.id
            try:
                answer = link.call("POST", "/workloads", tenant=row.tenant, json=body,
                                   params={"hold": "true"} if carried else None)
            except MemberUnreachable as exc:
                self._event(row.id, "federation_offer_lost", f"{exc}; the offer is looked for there before "
                            "any other")
                return None  # its answer may be lost with a copy made: found or given up before moving on
            if answer.status_code != 201:
                self._set_offer(offer_id, "", "refused")
                refusals.append(f"{name}: {_message(answer)}")
                continue
            member_id = str(answer.json()["id"])
            resumed = self._give_checkpoint(link, row, member_id, carried) if carried else ""
            self._set_offer(offer_id, member_id, "current")
            if self._cas(row, state="placed", member=name, member_id=member_id, status="pending"):
                link.state.took(row.gpus)  # the next offer of this round sees it taken
                self._event(row.id, "federation_placed", f"offered to {name} under {ranked.policy} "
                            f"({ranked.why.get(name, '')}) and kept there as {member_id}{resumed}"
                            + (f"; refused first by {'; '.join(refusals)}" if refusals else ""))
                return name
            self._set_offer(offer_id, member_id, "stale")  # cancelled at the hub meanwhile: withdraw it
            self._withdraw(row.tenant, name, member_id)
            return None
        self._event(row.id, "federation_refused", "no member admits it now: " + "; ".join(refusals))
        return None

    # ------------------------------------------------------------ checkpoints

    def _checkpoint(self, workload_id: str) -> FedCheckpointRow | None:
        with self.store.read() as session:
            found = session.get(FedCheckpointRow, workload_id)
            if found is not None:
                session.expunge(found)
            return found

    def checkpoint_mark(self, workload_id: str) -> float | None:
        with self.store.read() as session:
            return session.scalar(select(FedCheckpointRow.mark_s)
                                  .where(FedCheckpointRow.workload_id == workload_id))

    def _give_checkpoint(self, link: MemberLink, row: FedWorkloadRow, member_id: str,
                         carried: FedCheckpointRow) -> str:
        """Put the carried checkpoint into the new copy (submitted held, so no pod starts before it is
        there), then release the copy; what the placement event adds about it. A release lost here is
        done by the watch (it releases a copy held on the member but not at the hub)."""
        said = ""
        try:
            put = link.call("PUT", f"/workloads/{member_id}/checkpoint", tenant=row.tenant,
                            content=carried.data, timeout_s=60.0)
            if put.status_code == 200:
                said = (f"; it resumes from its checkpoint of {carried.size} bytes made on {carried.member} "
                        f"at {time.strftime('%H:%M:%S', time.gmtime(carried.mark_s))} UTC")
            else:
                said = (f"; its checkpoint could not be given there ({_message(put)}): it starts from the "
                        "beginning")
            if not row.held:
                link.call("POST", f"/workloads/{member_id}/release", tenant=row.tenant)
        except MemberUnreachable as exc:
            said = f"; its checkpoint or release was not answered ({exc}): the watch releases it"
        return said

    def _fetch_checkpoint(self, link: MemberLink, row: FedWorkloadRow) -> None:
        """Keep the latest checkpoint of running work that declares checkpoints (the member answers 304
        while its mark is not newer than the one held); it is fetched as the workload's tenant, kept
        under the hub's id, and given only to that workload's next copy."""
        held = self._checkpoint(row.id)
        params: dict[str, Any] = {"max_bytes": int(self.config.checkpoint_max_mb * 2**20)}
        if held is not None:
            params["since_s"] = held.mark_s
        try:
            answer = link.call("GET", f"/workloads/{row.member_id}/checkpoint", tenant=row.tenant,
                               params=params, timeout_s=60.0)
        except MemberUnreachable:
            return
        if answer.status_code == 413:
            if self._last_refusal.get(row.id) != "checkpoint":
                self._last_refusal[row.id] = "checkpoint"
                self._event(row.id, "federation_checkpoint_too_large", f"{_message(answer)}: a move would "
                            "start it from the beginning")
            return
        if answer.status_code != 200:
            return
        mark = float(answer.headers.get("X-Gpupool-Checkpoint-Mark") or self.clock())
        data = answer.content
        with self.store.write() as session:  # only over an older mark (compare-and-set)
            found = session.get(FedCheckpointRow, row.id)
            if found is None:
                session.add(FedCheckpointRow(workload_id=row.id, tenant=row.tenant, member=link.name,
                                             mark_s=mark, size=len(data), data=data, at_s=self.clock()))
            else:
                session.execute(update(FedCheckpointRow).where(
                    FedCheckpointRow.workload_id == row.id, FedCheckpointRow.mark_s == found.mark_s)
                    .values(member=link.name, mark_s=mark, size=len(data), data=data, at_s=self.clock()))

    def _drop_checkpoint(self, workload_id: str) -> None:
        with self.store.write() as session:
            session.execute(delete(FedCheckpointRow).where(FedCheckpointRow.workload_id == workload_id))

    def _set_offer(self, offer_id: int, member_id: str, state: str) -> None:
        with self.store.write() as session:
            session.execute(update(FedPlacementRow).where(  # only over an open offer (compare-and-set)
                FedPlacementRow.id == offer_id, FedPlacementRow.state.in_(("offered", "current")))
                .values(member_id=member_id, state=state))

    def _unresolved_offer(self, row: FedWorkloadRow) -> bool:
        """An offer whose answer was lost: adopt the copy it made, or give it up; True while unknown."""
        with self.store.read() as session:
            lost = list(session.scalars(select(FedPlacementRow).where(
                FedPlacementRow.workload_id == row.id, FedPlacementRow.state == "offered")))
            session.expunge_all()
        for offer in lost:
            link = self.by_name.get(offer.member)
            if link is None:
                continue
            if not link.state.up:
                if self.clock() - offer.at_s < self.config.requeue_grace_s:
                    return True
                self._set_offer(offer.id, "", "stale")  # swept when that member answers again
                continue
            try:
                copies = self._copies(link, row.tenant, row.id)
            except MemberUnreachable:
                return True
            if not copies:
                self._set_offer(offer.id, "", "refused")
                continue
            keep, *extra = copies
            self._set_offer(offer.id, keep, "current")
            for member_id in extra:
                self._withdraw(row.tenant, link.name, member_id)
            if self._cas(row, state="placed", member=link.name, member_id=keep, status="pending"):
                self._event(row.id, "federation_placed", f"its lost offer to {link.name} made {keep}: kept")
            return True
        return False

    def _copies(self, link: MemberLink, tenant: str, workload_id: str) -> list[str]:
        """The member's unfinished copies of hub workload `workload_id` (by the id in their env)."""
        found = []
        offset = 0
        while True:
            answer = link.call("GET", "/workloads", tenant=tenant, params={
                "full": "true", "limit": 500, "offset": offset,
                "status": ["pending", "admitted", "running"]})
            if answer.status_code != 200:
                raise MemberUnreachable(f"{link.name} answered {answer.status_code} listing work")
            page = answer.json()
            found += [item["id"] for item in page["items"]
                      if item.get("spec", {}).get("env", {}).get(FEDERATION_ID_ENV) == workload_id]
            offset += len(page["items"])
            if not page["items"] or offset >= page["total"]:
                return found

    def _withdraw(self, tenant: str, member: str, member_id: str) -> bool:
        """Cancel a copy on its member; True when it is cancelled or had ended (nothing left running)."""
        link = self.by_name.get(member)
        if link is None:
            return True
        try:
            answer = link.call("POST", f"/workloads/{member_id}/cancel", tenant=tenant)
        except MemberUnreachable:
            return False
        done = answer.status_code in (200, 404, 409)
        if done:
            with self.store.write() as session:
                session.execute(update(FedPlacementRow).where(
                    FedPlacementRow.member == member, FedPlacementRow.member_id == member_id,
                    FedPlacementRow.state.in_(("stale", "current"))).values(state="withdrawn"))
        return done

    # ------------------------------------------------------------ monitor

    def _monitor_loop(self) -> None:
        while not self._stop.wait(self.config.poll_interval_s):
            try:
                self.monitor_round()
            except Exception:  # a member's odd answer must not end the hub's watch
                log.exception("monitor round failed")

    def monitor_round(self) -> None:
        now = self.clock()
        for link in self.links:
            _, changed = link.poll(now, self.config.member_down_after_s)
            if changed:
                log.warning("member %s is %s%s", link.name, "up" if link.state.up else "down",
                            f": {link.state.note}" if link.state.note else "")
                self.wake.set()
            if link.state.up:
                self._sweep(link)
        for row in self._rows("placed"):
            held = self.by_name.get(row.member or "")
            if held is None:
                continue
            link = held
            if link.state.up:
                if not self._follow(link, row):
                    self._maybe_withdraw(link, row, now)
            else:
                self._maybe_move(link, row, now)

    def _follow(self, link: MemberLink, row: FedWorkloadRow) -> bool:
        """Read the member's copy into the record; True when the record changed (or may have)."""
        try:
            answer = link.call("GET", f"/workloads/{row.member_id}", tenant=row.tenant)
        except MemberUnreachable:
            return True
        if answer.status_code == 404:  # the member lost it (its store was replaced): place it again
            self._move(row, f"{link.name} no longer knows {row.member_id}")
            return True
        if answer.status_code != 200:
            return True
        view = answer.json()
        status = str(view["status"])
        if status == "pending" and view.get("held") == "user" and not row.held \
                and not self._held_now(row.id):  # held by the member's restart or fence, not by its
            # tenant through the hub (whose hold is recorded here before it reaches the member, so it
            # is read again after the member's answer): still ours
            try:
                link.call("POST", f"/workloads/{row.member_id}/release", tenant=row.tenant)
            except MemberUnreachable:
                return True
        if status == "running" and row.spec.get("checkpoint_interval_s"):
            self._fetch_checkpoint(link, row)
        if status == row.status and status not in ENDED:
            return False
        if self._cas(row, status=status, view=view, state="done" if status in ENDED else "placed") \
                and status in ENDED:
            self._drop_checkpoint(row.id)
        return True

    def _maybe_withdraw(self, link: MemberLink, row: FedWorkloadRow, now: float) -> None:
        """The re-offer (MultiKueue keeps queued work offered to every candidate; the hub re-ranks it
        instead): a copy its member has not admitted within offer_timeout_s is re-ranked every round
        and moves when another member starts it now, sooner and ranked better by the tenant's policy
        (core.federation.reoffer). It is offered again only once its member says the copy is cancelled."""
        if row.status != "pending" or row.held or now - row.updated_s < self.config.offer_timeout_s:
            return  # a held copy waits where it is for its release
        spec = WorkloadSpec.model_validate(row.spec, context=STORED)
        found = reoffer_target(self.config, self.links, row.tenant, spec, link.name, now)
        if found is None:
            return
        target, why = found
        try:
            answer = link.call("POST", f"/workloads/{row.member_id}/cancel", tenant=row.tenant)
        except MemberUnreachable:
            return
        if answer.status_code != 200 or answer.json().get("status") != "cancelled":
            return  # it started meanwhile (or ended): it stays where it is
        self._move(row, f"re-offered: {link.name} had not admitted it after {now - row.updated_s:.0f} s and "
                   f"{why}; withdrawn there to be offered to {target}", withdrawn=True)

    def _maybe_move(self, link: MemberLink, row: FedWorkloadRow, now: float) -> None:
        down_since = link.state.down_since_s or now
        fence = link.fence_s()
        # silent since the last call the member may have got (its fence counts from there), not
        # since the poll round that last read it began
        silent = now - max((t for t in (link.state.last_ok_s, link.state.reached_s) if t is not None),
                           default=down_since)
        if row.status in BEFORE_START:
            # the record is a poll old: a copy it calls pending may have started since. A member that
            # fences holds or stops it once silent for its fence, so the move waits that long, and
            # member_down_after_s (at least a poll) more for the member's own loop to get there: one
            # poll more was a fifth of a second in a test, and a member's loop on a loaded machine
            # stopped the copy later than that. Without a fence it moves at once (a dead member
            # runs nothing)
            margin = max(self.config.poll_interval_s, self.config.member_down_after_s)
            if fence is None or silent > fence + margin:
                self._move(row, f"{link.name} stopped answering while it waited there ({link.state.note})"
                           + (f"; silent {silent:.0f} s, past its fence of {fence:g} s" if fence else ""))
        elif (now - down_since >= self.config.requeue_grace_s
              and silent >= self.config.member_down_after_s + self.config.requeue_grace_s):
            carried = self._checkpoint(row.id)
            self._move(row, f"{link.name} stopped answering while it ran there, for "
                       f"{now - down_since:.0f} s (grace {self.config.requeue_grace_s:g} s); it starts "
                       "again elsewhere" + (f" from its checkpoint of {carried.size} bytes" if carried else
                                           ", from the beginning (no checkpoint was fetched)"))

    def _move(self, row: FedWorkloadRow, why: str, *, withdrawn: bool = False) -> None:
        if self._cas(row, state="queued", member=None, member_id=None, status="pending", moves=row.moves + 1):
            self._mark_stale(row, why)
            if withdrawn:
                with self.store.write() as session:
                    session.execute(update(FedPlacementRow).where(
                        FedPlacementRow.workload_id == row.id,
                        FedPlacementRow.member_id == (row.member_id or ""),
                        FedPlacementRow.state == "stale").values(state="withdrawn"))
            self._event(row.id, "federation_moved", f"taken back from {row.member} ({row.member_id}): {why}")
            self.wake.set()

    def _sweep(self, link: MemberLink) -> None:
        """Cancel the copies on `link` that the hub gave up: its record wins."""
        with self.store.read() as session:
            stale = list(session.scalars(select(FedPlacementRow).where(
                FedPlacementRow.member == link.name, FedPlacementRow.state == "stale")))
            session.expunge_all()
        for copy in stale:
            ids = [copy.member_id] if copy.member_id else self._lost_copies(link, copy)
            for member_id in ids:
                if self._withdraw(copy.tenant, link.name, member_id):
                    self._event(copy.workload_id, "federation_stale_cancelled",
                                f"the copy {member_id} on {link.name} was given up by the hub; "
                                "cancelled there")
            if not copy.member_id:
                with self.store.write() as session:
                    session.execute(update(FedPlacementRow).where(FedPlacementRow.id == copy.id)
                                    .values(state="withdrawn"))

    def _lost_copies(self, link: MemberLink, copy: FedPlacementRow) -> list[str]:
        try:
            found = self._copies(link, copy.tenant, copy.workload_id)
        except MemberUnreachable:
            return []
        with self.store.read() as session:
            row = session.get(FedWorkloadRow, copy.workload_id)
            current = row.member_id if row is not None and row.member == link.name else None
        return [member_id for member_id in found if member_id != current]


def _message(answer: Any) -> str:
    try:
        return str(answer.json().get("message", answer.text))[:300]
    except ValueError:
        return str(answer.text)[:300]
