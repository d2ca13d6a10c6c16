"""The server's one background thread: reconcile, then schedule, then wait to be woken."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import select

from gpupool.core.scheduling.cycle import Policies
from gpupool.errors import StoreUnavailable
from gpupool.providers.base import Provider
from gpupool.server.db import Fenced
from gpupool.server.federation_fence import Fence
from gpupool.server.leader import Leadership
from gpupool.server.loops.reconciler import Reconciler
from gpupool.server.loops.scheduler import Scheduler
from gpupool.server.metrics import Metrics
from gpupool.server.orm import PodRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.dependencies import DependencyPass
from gpupool.server.states import PodState

log = logging.getLogger("gpupool.loop")
WAKE_DELAY_S = 0.003
LAUNCH_SLOW_S = 0.5
"""After a step that handed launches to the nodes' workers, the loop waits for them to come back
before it looks at new work, as long as none of those under way has taken this long (up to
LAUNCH_REST_MAX_S in all): the submissions and pod exits that arrive meanwhile are decided in one
cycle (a full pass over the pending work when capacity changed), as when the step itself waited for
its launches, while a node that hangs holds the loop no longer than this."""
LAUNCH_REST_MAX_S = 2.0
LAUNCH_REST_S = 0.05
"""How often the launch rest looks at the launches under way (the last one back, or a failure,
ends it at once)."""
STOP_SWEEP_S = 0.5
"""With several servers: how often the leader stops the pods another server marked stopping."""
MAX_CYCLES_PER_STEP = 3
"""Cycles run in one step while each one stops (preempts or evicts) something, as the replay does
at one event time: requeued work gets another cycle at once (it may fit elsewhere)."""


class ControlLoop:
    """Runs `step()` whenever woken (submit, cancel, quota change) or every interval.

    While pods run or launch it polls the provider often (busy interval) so exits and launch
    outcomes are recorded quickly. Launches themselves run in the nodes' launch workers
    (loops/launches.py): a step never waits on a provider's launch, and the loop rests for them
    while they are under way, none slow (LAUNCH_SLOW_S).
    """

    def __init__(self, rt: Runtime, metrics: Metrics | None = None,
                 leadership: Leadership | None = None,
                 reopen_provider: Callable[[], Provider] | None = None) -> None:
        self.rt = rt
        self.metrics = metrics
        self.fence = Fence(rt)
        self.leadership = leadership
        """Several servers on one store (server/leader.py): the loop acts only while this server
        leads, each step's writes fenced by its epoch. None: a single server, always acting."""
        self.reopen_provider = reopen_provider
        """With leadership: opens the provider afresh at each takeover, so it re-adopts the pods
        the previous leader launched (the local agents' state on disk, Ray's detached actors)."""
        self._epoch: int | None = None
        self._build()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.recovered: tuple[int, int] | None = None
        self._last_cycle = float("-inf")
        self._exited = threading.Event()
        self._launched = threading.Event()
        self._led = threading.Event()
        self._next_stop_sweep = float("-inf")
        self._first_step_of: int | None = None
        """The epoch of a takeover whose first step is still to come (its parts are logged)."""

    def _build(self) -> None:
        rt, metrics = self.rt, self.metrics
        self.scheduler = Scheduler(rt, policies(rt), seed=rt.settings.seed)
        self.reconciler = Reconciler(rt, on_final=self.scheduler.finished)
        self.scheduler.launches.on_outcome = self._launches_back
        self.dependencies = DependencyPass(rt)
        if self.leadership is not None:
            self.scheduler.launches.may_launch = self._still_leading
            self.scheduler.launches.launch_epoch = lambda: self._epoch  # the node fences by it
        if metrics is not None:
            divergence = metrics.store_view_divergence
            self.scheduler.store_audit.on_divergence = lambda kind, n: divergence.labels(kind).inc(n)
            self.scheduler.on_slide = metrics.reservation_slid

    def _still_leading(self) -> bool:
        if self.leadership is None or self._epoch is None:
            return False
        return self.leadership.acting_epoch() == self._epoch

    def start(self) -> None:
        if self.leadership is None:
            self.recovered = self.reconciler.recover()
            # pods' exits wake the loop (no waiting for the next poll), where the provider reports them
            self.rt.provider.add_exit_listener(self._pods_exited)
        else:
            self.leadership.on_change = self._leadership_changed
        self._thread = threading.Thread(target=self._run, name="gpupool-control-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.rt.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def step(self, woken: bool = True) -> bool:
        """Reconcile, then schedule when woken, when pods ended, or when a cycle is due.

        Returns True while work is in flight, so the provider is polled again soon.
        """
        began = time.monotonic()
        recorded = self.scheduler.record_launches()  # before the poll: a pod started is then running
        if self.leadership is not None:
            self._stop_asked_elsewhere()
        synced = time.monotonic()
        changed = self.reconciler.sync()
        changed += self.fence.check()  # a federation member whose hub is silent (federation_fence.py)
        changed += self.reconciler.nodes_gone(self.rt.nodes())
        changed += self.scheduler.enforce_time_limits()
        if changed or self.scheduler.waiting:
            changed += self.scheduler.promote_waiting()
        capacity_changed = bool(changed) or self.rt.capacity_changed.is_set()
        # work that ended (or a cancel) may satisfy, or break, the dependencies pending work waits on:
        # judged before the cycle, so what they clear is placed in it
        submitted = self.rt.dependencies_changed.is_set()
        if capacity_changed or self.dependencies.dirty or submitted:
            self.rt.dependencies_changed.clear()
            if self.dependencies.run(force=self.dependencies.dirty, arrivals=submitted):
                capacity_changed = True
        due = time.monotonic() - self._last_cycle >= self.rt.settings.cycle_interval_s
        admitted, cycled = 0, time.monotonic()
        if woken or capacity_changed or due:
            self.rt.capacity_changed.clear()
            self._last_cycle = time.monotonic()
            for _ in range(MAX_CYCLES_PER_STEP):
                stats = self.scheduler.cycle(capacity_changed)
                admitted += stats.admitted
                # Outcomes back already (inline launches, quick workers) before the next cycle, so
                # a workload it stops is stopped from running, as it is: launched, then preempted.
                recorded += self.scheduler.record_launches()
                if self.metrics is not None and stats.pending:
                    self.metrics.cycle_seconds.observe(stats.seconds)
                if not stats.stopped:
                    break
        recorded += self.scheduler.record_launches()  # those that returned meanwhile (or ran inline)
        if self._first_step_of is not None:  # the first step after a takeover: where its time went
            log.warning("first step epoch=%d sweep_s=%.3f sync_s=%.3f cycle_s=%.3f admitted=%d",
                        self._first_step_of, synced - began, cycled - synced, time.monotonic() - cycled,
                        admitted)
            self._first_step_of = None
        busy = self.reconciler.active or self.scheduler.waiting or self.scheduler.launches.busy
        in_flight = bool(changed or admitted or busy or recorded)
        self.rt.usage_rollup.maybe_fold(self.rt, in_flight)  # pods that ended join the usage rollup
        return in_flight

    def _pods_exited(self) -> None:
        self._exited.set()
        self.rt.wake.set()

    def _launches_back(self) -> None:
        """A failed launch, or the last one in flight, came back: it ends the loop's launch rest. The
        loop is busy while launches are in flight, so its next step, at most a busy interval later,
        records the outcomes."""
        self._launched.set()

    # ------------------------------------------------------------------ several servers

    def _stop_asked_elsewhere(self) -> None:
        """A cancel (or any stop) answered by another server marks the pods stopping in the store,
        but only this server's provider holds them: every STOP_SWEEP_S the leader asks its provider
        to stop each pod the store says is stopping (a no-op for those already asked)."""
        now = time.monotonic()
        if now < self._next_stop_sweep:
            return
        self._next_stop_sweep = now + STOP_SWEEP_S
        with self.rt.store.read() as session:
            pod_ids = list(session.scalars(select(PodRow.id).where(PodRow.status == PodState.STOPPING.value)))
        for pod_id in pod_ids:
            self.rt.provider.stop(pod_id)

    def _leadership_changed(self) -> None:
        self._led.set()
        self.rt.wake.set()

    def _lead(self) -> int | None:
        """The epoch to act under in this step, None while following (then it waits for a change).
        A new epoch is a takeover: the scheduler's state is built afresh from the store."""
        assert self.leadership is not None
        epoch = self.leadership.acting_epoch()
        if epoch is None:
            if self._epoch is not None:
                log.warning("stopped scheduling: this server no longer leads (epoch %d)", self._epoch)
                self._epoch = None
                if self.metrics is not None:
                    self.metrics.is_leader.set(0)
            self._led.wait(min(0.5, self.leadership.renew_s))
            self._led.clear()
            return None
        if epoch != self._epoch:
            self._take_over(epoch)
        return epoch

    def _confirm_epoch(self) -> None:
        """Raises Fenced unless this thread's epoch is still the lease's (an empty fenced write)."""
        with self.rt.store.write():
            pass

    def _take_over(self, epoch: int) -> None:
        """Rebuild from the store at a new epoch: a fresh provider (re-adopting what the previous
        leader launched), a fresh scheduler, recovery of every active pod; all writes fenced.
        Logs the time each part took (`takeover epoch=N fence_s=...`: bench/failover.py reads it)."""
        began = time.monotonic()
        parts: dict[str, float] = {}

        def part(name: str, since: float) -> float:
            now = time.monotonic()
            parts[name] = now - since
            return now

        self._epoch = None
        with self.rt.store.fenced(epoch):
            # First the nodes learn the epoch (a deposed leader's launch is refused from now on, or
            # was let go before and is on record), then their records are read afresh (fencing.py).
            self.rt.provider.fence(epoch, confirm=self._confirm_epoch)
            mark = part("fence", began)
            if self.reopen_provider is not None:
                try:  # closed first: the fresh one then finds this machine's pod network free
                    self.rt.provider.close()
                except Exception:
                    log.exception("closing the previous provider failed")
                mark = part("close", mark)
                self.rt.provider = self.reopen_provider()
                mark = part("reopen", mark)
            self.rt.refresh_nodes()
            self._build()
            mark = part("build", mark)
            self.recovered = self.reconciler.recover()
            part("recover", mark)
        self.rt.provider.add_exit_listener(self._pods_exited)
        self._epoch = self._first_step_of = epoch
        self._last_cycle = float("-inf")
        self.rt.capacity_may_have_changed()
        if self.metrics is not None:
            self.metrics.is_leader.set(1)
            self.metrics.leader_changes.inc()
        log.warning("leading at epoch %d: re-adopted %d pods, %d lost, in %.2f s", epoch,
                    self.recovered[0], self.recovered[1], time.monotonic() - began)
        log.warning("takeover epoch=%d %s done_wall=%.3f", epoch,
                    " ".join(f"{name}_s={seconds:.3f}" for name, seconds in parts.items()), time.time())

    def _run(self) -> None:
        settings = self.rt.settings
        while not self._stop.is_set():
            epoch: int | None = None
            if self.leadership is not None:
                try:
                    epoch = self._lead()
                except Fenced:
                    continue  # the lease moved on meanwhile: the next round follows
                except StoreUnavailable:
                    self._epoch = None  # half a takeover: made again once the store answers
                    self._stop.wait(settings.cycle_interval_s)
                    continue
                if epoch is None:
                    continue
            exited = self._exited.is_set()
            self._exited.clear()
            woken = self.rt.wake.is_set()
            rest = woken and not exited  # pods' exits are handled at once, without the rests below
            if rest:
                # Let the request that woke the loop be answered first: the API shares the GIL with
                # this thread, and a cycle starting at once would hold up that answer by a switch
                # interval or more (it also gathers the next few submissions into this cycle).
                self._stop.wait(WAKE_DELAY_S)
            self.rt.wake.clear()
            self._launched.clear()
            began, began_cpu = time.perf_counter(), time.process_time()
            handed = self.scheduler.launches.handed
            try:
                with self.rt.store.fenced(epoch):
                    busy = self.step(woken)
            except Fenced:
                busy = False
                if self.leadership is not None and epoch is not None:
                    self.leadership.lost(epoch)
            except StoreUnavailable:  # the store logged the outage once; try again next interval
                busy = False
                self._stop.wait(settings.cycle_interval_s)
            except Exception:  # the loop must outlive any one bad cycle
                log.exception("control loop step failed; retrying")
                busy = False
                time.sleep(settings.cycle_interval_s)
            if rest:
                # A burst of submissions wakes the loop once per request: resting as long as the
                # step took batches them into cycles and leaves the API at least half the CPU. Not
                # longer than the CPU the process used meanwhile: a step that waited (on a launch
                # that timed out) took no CPU from the API, and a rest would only delay other work.
                self._stop.wait(min(time.perf_counter() - began, time.process_time() - began_cpu))
            if self.scheduler.launches.handed != handed:
                self._launch_rest()
            # Then the next wake (submit, cancel, quota change) starts a step at once; while pods run
            # the provider is polled every busy interval so exits free their slices quickly.
            self.rt.wake.wait(settings.busy_poll_interval_s if busy else settings.cycle_interval_s)


    def _launch_rest(self) -> None:
        """Wait while the launches handed over are under way, none of them slow (see LAUNCH_SLOW_S)."""
        launches = self.scheduler.launches
        deadline = time.monotonic() + LAUNCH_REST_MAX_S
        while launches.launching and not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or launches.longest_s() >= LAUNCH_SLOW_S:
                return  # a launch this slow: its node may hang, the loop goes on
            self._launched.wait(min(LAUNCH_REST_S, left))
            self._launched.clear()


def policies(rt: Runtime) -> Policies:
    """The core's policies from the pool configuration, with `gpupool up --policy` (when given)
    for the placement. An unknown placement or ordering name is UnknownName (with a suggestion),
    so a typo stops start-up rather than quietly running another policy."""
    from gpupool.core.scheduling.ordering.base import make_ordering
    from gpupool.core.scheduling.policies.base import policy_class

    chosen = rt.config.policies(placement=rt.settings.placement or None)
    policy_class(chosen.placement)
    make_ordering(chosen.ordering, **dict(chosen.ordering_options))
    return chosen
