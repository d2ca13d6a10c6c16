"""Several servers on one store (`gpupool up --ha`): one leader, chosen by a lease in the store.

Every server serves the whole API; only the leader runs the control loop (scheduling, reconciling,
the providers' monitors). Leadership is the one row of `leader_lease`: holder, epoch, expiry.

- Taking it: a server that finds the lease expired (or absent) writes itself as holder with the
  epoch one higher, by compare-and-set on the epoch it read: of two contenders one wins.
- Keeping it: the holder renews every `renew_s` (compare-and-set on holder and epoch), pushing the
  expiry `lease_s` ahead of the time the renewal started.
- Losing it in time: the leader acts only until `renew_deadline_s` (two thirds of the lease) after
  the start of its last successful renewal, measured on its monotonic clock, so a leader that
  stalls (SIGSTOP, a stalled disk, a lost store) stops acting before any other server may take
  over, as Kubernetes' leader election does (lease 15 s, renew deadline 10 s).
- Fencing: the loop's writes run under `Store.fenced(epoch)`, so a transaction whose epoch is no
  longer the lease's is refused inside the store (server/db.py): a leader that wakes up after a
  takeover, in the middle of a step, writes nothing.

The wall-clock expiry is compared by the other servers with their own clocks: keep the servers'
clocks in step (NTP) to well within a third of the lease.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

import gpupool
from gpupool.errors import StoreUnavailable
from gpupool.server.db import Store
from gpupool.server.orm import LeaderLeaseRow, ServerRow

log = logging.getLogger("gpupool.leader")
LEASE_ID = 1
DEFAULT_LEASE_S = 10.0
DEFAULT_RENEW_S = 2.0
SERVER_GONE_S = 3600.0
"""A server not seen for this long is dropped from `servers` by the leader."""


@dataclass(frozen=True, slots=True)
class LeaseView:
    """The lease as last read: who holds it, under which epoch, until when (wall clock)."""

    holder: str
    epoch: int
    expires_s: float
    renewed_s: float


def bound_stalled_transactions(store: Store, seconds: float) -> None:
    """PostgreSQL ends any session of this server that sits inside a transaction for `seconds`
    (idle_in_transaction_session_timeout). A leader stopped (SIGSTOP) in the middle of a fenced
    transaction holds the lease row FOR SHARE, and the takeover's update of that row would wait for
    it as long as the process stays stopped: ended by the database, its transaction rolls back and
    the takeover goes on. Applied to every connection this store opens from now on."""
    if store.is_sqlite:
        return
    from sqlalchemy import event

    millis = max(1, int(seconds * 1000))

    @event.listens_for(store.engine, "connect")
    def _bound(dbapi_connection: object, _record: object) -> None:
        cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
        cursor.execute(f"SET idle_in_transaction_session_timeout = {millis}")
        cursor.close()
        dbapi_connection.commit()  # type: ignore[attr-defined]

    store.engine.dispose()  # connections pooled before (the migrations') are opened again with it


def _end_stale_fenced_transactions(conn: Connection) -> None:
    """Before taking an expired lease on PostgreSQL: end the sessions that hold its row FOR SHARE
    (every fenced transaction does, until it ends). They are the previous leader's, past its renew
    deadline: stopped (SIGSTOP) in the middle of one, a leader holds the row for as long as it stays
    stopped, and the takeover's update would wait as long. A session idle in its transaction is ended
    by the database after the renew deadline already (bound_stalled_transactions), but not one the
    database is still sending to (a stopped client that reads no more) or one inside a long
    statement; their transactions roll back, and a resumed leader finds its connection gone and
    follows."""
    try:
        with conn.begin_nested():  # a role that may not end them: the takeover goes on, and waits
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'relation' "
                "AND relation = 'leader_lease'::regclass AND mode = 'RowShareLock' AND granted "
                "AND pid <> pg_backend_pid()")
    except DBAPIError as exc:
        log.warning("could not end the previous leader's transactions (%s); the takeover waits for them",
                    " ".join(str(exc.orig).split()))


def new_server_id() -> str:
    return "s-" + uuid.uuid4().hex[:10]


class Leadership:
    """This server's side of the lease: `round()` takes or renews it once; `start()` runs rounds
    every `renew_s` in a thread of its own (never behind a scheduling step)."""

    def __init__(self, store: Store, *, server_id: str | None = None, address: str = "",
                 lease_s: float = DEFAULT_LEASE_S, renew_s: float = DEFAULT_RENEW_S,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not 0 < renew_s < lease_s:
            raise ValueError("the renew interval must be positive and shorter than the lease")
        self.store = store
        self.server_id = server_id or new_server_id()
        self.address = address
        self.lease_s = lease_s
        self.renew_s = renew_s
        self.renew_deadline_s = lease_s * 2 / 3
        self.clock = clock
        self.monotonic = monotonic
        self.epoch: int | None = None
        """The epoch this server holds the lease under (None: it follows)."""
        self._valid_until = float("-inf")
        """Monotonic time up to which the leader acts (start of the last renewal + renew deadline)."""
        self.lease: LeaseView | None = None
        self.changes = 0
        """Times this server became leader."""
        self.on_renew: Callable[[float], None] = lambda seconds: None
        """Called with the seconds each successful take or renewal took (for /metrics)."""
        self.on_change: Callable[[], None] = lambda: None
        """Called when this server starts or stops leading (it wakes the control loop)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started_s = clock()

    # ------------------------------------------------------------------ what the loop asks

    def acting_epoch(self) -> int | None:
        """The epoch to act under now, or None: not leading, or the last renewal is too old."""
        with self._lock:
            if self.epoch is None or self.monotonic() >= self._valid_until:
                return None
            return self.epoch

    @property
    def is_leader(self) -> bool:
        return self.acting_epoch() is not None

    def lost(self, epoch: int) -> None:
        """The store refused a write under `epoch` (fenced): stop leading at once."""
        with self._lock:
            if self.epoch != epoch:
                return
            self.epoch = None
        log.warning("server %s was fenced at epoch %d: another server leads; following",
                    self.server_id, epoch)
        self.on_change()

    # ------------------------------------------------------------------ one round

    def round(self) -> bool:
        """Take or renew the lease once (and heartbeat this server's row); True while leading."""
        began, now = self.monotonic(), self.clock()
        held = self.epoch
        try:
            won = self._cas(now, held)
        except StoreUnavailable:
            won = None  # the store is down: keep the epoch, act until the renew deadline passes
        except IntegrityError:
            won = False  # another server inserted the first lease at the same time
        if won is None:
            return self.acting_epoch() is not None
        changed = False
        with self._lock:
            if won:
                self._valid_until = began + self.renew_deadline_s
                assert self.lease is not None
                changed = self.epoch != self.lease.epoch
                self.epoch = self.lease.epoch
                if changed:
                    self.changes += 1
            elif self.epoch is not None:
                self.epoch, changed = None, True
        if won:
            self.on_renew(self.monotonic() - began)
        if changed:
            if won:
                log.warning("server %s leads the pool at epoch %d", self.server_id, self.epoch)
            else:
                log.warning("server %s no longer leads the pool (epoch %s, holder %s)", self.server_id,
                            self.lease.epoch if self.lease else "?", self.lease.holder if self.lease else "?")
            self.on_change()
        return bool(won)

    def _cas(self, now: float, held: int | None) -> bool:
        """One transaction: read the lease; renew it (ours), take it (expired or absent), or follow."""
        me = self.server_id
        expires = now + self.lease_s
        with self.store.write() as session:
            conn = session.connection()
            row = conn.execute(select(LeaderLeaseRow.holder, LeaderLeaseRow.epoch,
                                         LeaderLeaseRow.expires_s, LeaderLeaseRow.renewed_s)
                                  .where(LeaderLeaseRow.id == LEASE_ID)).first()
            self._heartbeat(conn, now)
            if row is None:
                conn.execute(insert(LeaderLeaseRow).values(
                    id=LEASE_ID, holder=me, epoch=1, expires_s=expires, renewed_s=now, acquired_s=now))
                self.lease = LeaseView(me, 1, expires, now)
                return True
            self.lease = LeaseView(row.holder, row.epoch, row.expires_s, row.renewed_s)
            if row.holder == me and row.epoch == held:
                done = conn.execute(update(LeaderLeaseRow).where(
                    LeaderLeaseRow.id == LEASE_ID, LeaderLeaseRow.holder == me,
                    LeaderLeaseRow.epoch == held).values(expires_s=expires, renewed_s=now)).rowcount
                if done == 1:
                    self.lease = LeaseView(me, row.epoch, expires, now)
                return done == 1
            if row.expires_s >= now:
                return False  # another server's lease (or ours, from before a restart) still runs
            if not self.store.is_sqlite:
                _end_stale_fenced_transactions(conn)
            epoch = row.epoch + 1
            taken = conn.execute(update(LeaderLeaseRow).where(
                LeaderLeaseRow.id == LEASE_ID, LeaderLeaseRow.epoch == row.epoch,
                LeaderLeaseRow.expires_s < now).values(
                holder=me, epoch=epoch, expires_s=expires, renewed_s=now, acquired_s=now)).rowcount
            if taken == 1:
                self.lease = LeaseView(me, epoch, expires, now)
            return taken == 1

    def _heartbeat(self, conn: Connection, now: float) -> None:
        seen = conn.execute(update(ServerRow).where(ServerRow.id == self.server_id)
                               .values(seen_s=now, address=self.address)).rowcount
        if seen == 0:
            conn.execute(insert(ServerRow).values(id=self.server_id, address=self.address,
                                                     version=gpupool.__version__,
                                                     started_s=self.started_s, seen_s=now))

    def release(self) -> None:
        """On a clean stop: give the lease up (expired now), so another server takes over at once."""
        with self._lock:
            epoch, self.epoch = self.epoch, None
        try:
            with self.store.write() as session:
                conn = session.connection()
                if epoch is not None:
                    conn.execute(update(LeaderLeaseRow).where(
                        LeaderLeaseRow.id == LEASE_ID, LeaderLeaseRow.holder == self.server_id,
                        LeaderLeaseRow.epoch == epoch).values(expires_s=self.clock() - 1))
                conn.execute(delete(ServerRow).where(ServerRow.id == self.server_id))
        except StoreUnavailable:
            pass  # the lease then runs out on its own

    # ------------------------------------------------------------------ the thread

    def start(self) -> None:
        self.round()
        self._thread = threading.Thread(target=self._run, name="gpupool-leader-lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.release()

    def _run(self) -> None:
        while not self._stop.wait(self.renew_s if self.epoch is not None else self._follow_wait()):
            try:
                self.round()
            except Exception:  # the lease thread must outlive any one failure
                log.exception("lease round failed; retrying")

    def _follow_wait(self) -> float:
        """A follower checks again every renew interval, or right when the lease runs out (10 ms
        after its expiry as last read: one more read if the holder renewed meanwhile)."""
        lease = self.lease
        if lease is None:
            return self.renew_s
        return max(0.01, min(self.renew_s, lease.expires_s - self.clock() + 0.01))


WAKE_CHANNEL = "gpupool_wake"
"""The PostgreSQL channel on which a follower's write wakes the leader's control loop."""


class _RelayedEvent(threading.Event):
    """The loop's wake event, which also tells `relay` each time it is set."""

    def __init__(self, relay: Callable[[], None]) -> None:
        super().__init__()
        self._relay = relay

    def set(self) -> None:
        super().set()
        self._relay()


class WakeRelay:
    """`gpupool up --ha` on PostgreSQL: a submission or cancel answered by a follower wakes the
    leader's loop at once instead of at its next full pass (the cycle interval).

    A request sets its server's wake event, as on a single server; on a follower this relay then
    sends one `NOTIFY gpupool_wake` (from a thread of its own, one per burst: the request never waits
    on it), and the leader, which LISTENs on a connection of its own, sets its loop's wake event. The
    notification is delivered at its commit, after the follower's write committed, so the woken
    step reads it."""

    def __init__(self, store: Store, leadership: Leadership) -> None:
        self.store = store
        self.leadership = leadership
        self.wake: threading.Event = _RelayedEvent(self._poke)
        """Takes the place of the runtime's wake event (`Runtime.wake`)."""
        self.sent = 0
        self.received = 0
        self.on_woken: Callable[[], None] = lambda: None
        """Called each time a follower's notification woke this (leading) server's loop (/metrics)."""
        self._pending = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _poke(self) -> None:
        if not self._stop.is_set():
            self._pending.set()

    def start(self) -> None:
        for target, name in ((self._send, "gpupool-wake-notify"), (self._listen, "gpupool-wake-listen")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._pending.set()
        for thread in self._threads:
            thread.join(timeout=5)

    def _send(self) -> None:
        while True:
            self._pending.wait()
            if self._stop.is_set():
                return
            self._pending.clear()
            if self.leadership.is_leader:
                continue  # the leader's own requests wake its loop directly
            try:
                with self.store.engine.connect() as conn:
                    conn.exec_driver_sql(f"NOTIFY {WAKE_CHANNEL}")
                    conn.commit()
                self.sent += 1
            except Exception:  # the store restarting: the leader's next full pass reads the write
                log.debug("could not notify the leader of a write", exc_info=True)

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                raw = self.store.engine.raw_connection()
            except Exception:
                self._stop.wait(1.0)  # the store restarting: listen again when it is back
                continue
            conn = raw.driver_connection
            raw.detach()  # its own connection for good: never handed back to the pool
            try:
                conn.autocommit = True  # type: ignore[union-attr]
                conn.execute(f"LISTEN {WAKE_CHANNEL}")  # type: ignore[union-attr]
                while not self._stop.is_set():
                    for _ in conn.notifies(timeout=1.0, stop_after=1):  # type: ignore[union-attr]
                        self.received += 1
                        if self.leadership.is_leader:
                            threading.Event.set(self.wake)  # not relayed back
                            self.on_woken()
            except Exception:
                log.debug("the wake channel's connection broke; listening again", exc_info=True)
                self._stop.wait(0.5)
            finally:
                with contextlib.suppress(Exception):
                    raw.close()
