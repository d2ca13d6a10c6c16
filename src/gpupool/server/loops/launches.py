"""Launches outside the control loop: one worker per node, fed after the admitting transaction commits.

A provider call may block (a node's agent forks the pod as its tenant's account; a remote node
answers over the network). Run inside the scheduling step, one slow node would hold up every
cycle and every other node's launches. So a provider that says its launch() may be called from
several threads (`concurrent_launch = True`, the local one) gets a queue per node, served by at
most PER_NODE threads of that node, and the loop only hands launches over and later records what
came of them (`collect()`): started (when) or failed (why). A launch that has not returned after
`deadline_s` is reported failed at once, its thread is left to finish on its own (the pod is then
stopped), and the node's queue goes on with a fresh thread.

Such a stuck thread cannot be killed, so a node whose launches all hang would grow threads without
bound. A node with MAX_STUCK threads stuck past the deadline is given no more: its queued launches,
and those handed over later, fail at once with a sentence naming the node, and the scheduler treats
the node as cordoned for new work (`stuck_nodes()`; the work running there is left alone) until one
of its stuck calls returns. `gpupool_launch_threads_stuck{node}` on /metrics counts them.

Other providers (the in-memory fake; Ray, whose client is not shared between threads) are called
inline, in the caller's thread, as before: their outcomes are collected the same way.

Crash safety is the store's: every pod handed here is recorded `launching` first, so a restart
re-adopts the pods the provider knows and requeues those it never saw (`Reconciler.recover`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from gpupool.errors import GpupoolError
from gpupool.pods import PodLaunch
from gpupool.providers.base import Provider

log = logging.getLogger("gpupool.launches")
PER_NODE = 4
"""Launches one node's worker runs at once: a launch mostly waits on fork/exec and file writes."""
DEFAULT_DEADLINE_S = 30.0
"""How long one launch may take before its pod is reported failed (above the agent's own launch
helper deadline, GPUPOOL_LAUNCH_TIMEOUT_S, 10 s by default, so the agent's sentence wins)."""
MAX_STUCK = PER_NODE
"""Threads of one node stuck past the deadline at which the node is given no more launches."""
INTERNAL = "the launch failed with an internal error (the server's log has the details)."
NOT_LEADER = "not launched: this server stopped leading the pool before the launch began."


@dataclass(frozen=True, slots=True)
class Outcome:
    """What came of one launch: started at `started_s` (the provider took it), or failed with `why`."""

    launch: PodLaunch
    started_s: float | None = None
    why: str = ""


class LaunchWorkers:
    """Per-node launch queues and their threads; thread-safe."""

    def __init__(self, provider: Provider, clock: Callable[[], float], *,
                 deadline_s: float = DEFAULT_DEADLINE_S, on_outcome: Callable[[], None] = lambda: None,
                 per_node: int = PER_NODE, max_stuck: int = MAX_STUCK) -> None:
        self.provider = provider
        self.clock = clock
        self.deadline_s = deadline_s
        self.on_outcome = on_outcome
        """Called (from a worker thread) for a failed launch or the last one in flight: it ends the
        control loop's launch rest."""
        self.per_node = per_node
        self.max_stuck = max_stuck
        self.on_stuck_change: Callable[[], None] = lambda: None
        """Called (outside the lock) when a node starts or stops refusing launches for its stuck
        threads: the scheduler's view of the node changes (it is woken to run a full pass)."""
        self._stuck: dict[str, int] = {}
        """Threads of each node past the deadline whose provider call has not returned."""
        self.threaded = provider.concurrent_launch
        self.may_launch: Callable[[], bool] = lambda: True
        """Asked right before each provider call: False (a server that no longer leads, or whose
        lease renewal is overdue) fails the launch instead; the new leader places it again."""
        self.launch_epoch: Callable[[], int | None] = lambda: None
        """The leader epoch the launches handed over now were decided under (stamped on each, so the
        node refuses them once a newer leader took over); None: a single server."""
        self._lock = threading.Lock()
        self._queues: dict[str, deque[PodLaunch]] = {}
        self._workers: dict[str, int] = {}
        """Threads serving each node's queue (a thread past the deadline no longer counts)."""
        self._begun: dict[str, tuple[PodLaunch, float]] = {}
        """Launches a thread is in the middle of -> (launch, monotonic time it began)."""
        self._abandoned: set[str] = set()
        """Pods whose launch was reported failed at its deadline while its thread still waits."""
        self._failed: dict[tuple[str, str], str] = {}
        """Gangs (workload, attempt) with a failed pod among those in flight: their queued pods are
        not launched (an attempt placed later is another gang)."""
        self._in_flight: dict[str, tuple[str, str]] = {}
        """Pods handed over whose outcome was not collected yet -> their gangs."""
        self._done: list[Outcome] = []
        self.handed = 0
        """How many launches were handed over so far (the loop rests after a step that handed some)."""

    # ------------------------------------------------------------------ the loop's side

    def submit(self, launches: Sequence[PodLaunch]) -> None:
        """Hand launches over (after the transaction that recorded them `launching` committed)."""
        if not launches:
            return
        epoch = self.launch_epoch()
        if epoch is not None:
            launches = [replace(launch, epoch=epoch) for launch in launches]
        self.handed += len(launches)
        if not self.threaded:
            for launch in launches:
                with self._lock:
                    self._in_flight[launch.pod_id] = _gang(launch)
                    skip = self._failed.get(_gang(launch))
                self._finish(launch, self._call(launch) if skip is None else Outcome(launch, None, skip))
            return
        refused = False
        with self._lock:
            for launch in launches:
                self._in_flight[launch.pod_id] = _gang(launch)
                if self._refuses_locked(launch.node):
                    self._refuse_locked(launch)
                    refused = True
                else:
                    self._queues.setdefault(launch.node, deque()).append(launch)
            for node in {launch.node for launch in launches}:
                self._spawn_locked(node)
        if refused:
            self.on_outcome()

    def collect(self) -> list[Outcome]:
        """The outcomes ready now (each once), with a failure for every launch past its deadline."""
        now = time.monotonic()
        newly_stuck = False
        with self._lock:
            late = [(pod_id, launch) for pod_id, (launch, began) in self._begun.items()
                    if now - began >= self.deadline_s]
            for pod_id, launch in late:
                del self._begun[pod_id]
                self._abandoned.add(pod_id)
                self._workers[launch.node] -= 1
                self._stuck[launch.node] = self._stuck.get(launch.node, 0) + 1
                why = (f"node {launch.node} did not start it within {self.deadline_s:g} s (the server's "
                       "launch deadline); the node may be overloaded or its agent stuck.")
                self._failed.setdefault(_gang(launch), why)
                self._done.append(Outcome(launch, None, why))
                log.warning("launch of pod %s on node %s passed its %g s deadline", pod_id, launch.node,
                            self.deadline_s)
                if self._stuck[launch.node] == self.max_stuck:
                    newly_stuck = True
                    log.warning("node %s has %d launch threads stuck past the deadline: it is given no "
                                "more launches until one returns", launch.node, self.max_stuck)
                    for queued in self._queues.pop(launch.node, ()):
                        self._refuse_locked(queued)
                self._spawn_locked(launch.node)
            done, self._done = self._done, []
            for outcome in done:
                self._in_flight.pop(outcome.launch.pod_id, None)
            if self._failed:
                flying = set(self._in_flight.values())
                for gang in [g for g in self._failed if g not in flying]:
                    del self._failed[gang]
        if newly_stuck:
            self.on_stuck_change()
        return done

    def stuck(self) -> dict[str, int]:
        """Threads of each node stuck past the launch deadline (every node that had one; 0 once all
        of its stuck calls returned)."""
        with self._lock:
            return dict(self._stuck)

    def stuck_nodes(self) -> frozenset[str]:
        """The nodes given no more launches until one of their stuck calls returns."""
        with self._lock:
            return frozenset(node for node in self._stuck if self._refuses_locked(node))

    def withdraw(self, pod_ids: Iterable[str]) -> set[str]:
        """Take back launches no thread has begun (their pods were stopped meanwhile): they never
        reach the provider. Returns the ids taken back."""
        wanted = set(pod_ids)
        taken: set[str] = set()
        with self._lock:
            for queue in self._queues.values():
                keep = [launch for launch in queue if launch.pod_id not in wanted]
                if len(keep) != len(queue):
                    taken.update(launch.pod_id for launch in queue if launch.pod_id in wanted)
                    queue.clear()
                    queue.extend(keep)
            for pod_id in taken:
                del self._in_flight[pod_id]
        return taken

    def in_flight(self) -> frozenset[str]:
        """Pods handed over whose outcome was not collected yet."""
        with self._lock:
            return frozenset(self._in_flight)

    def longest_s(self) -> float:
        """How long the oldest launch under way has taken so far (0 when none is)."""
        now = time.monotonic()
        with self._lock:
            return max((now - began for _, began in self._begun.values()), default=0.0)

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._in_flight)

    @property
    def launching(self) -> bool:
        """Whether a launch is queued or under way (not counting those past their deadline)."""
        with self._lock:
            return bool(self._begun) or any(self._queues.values())

    # ------------------------------------------------------------------ the workers' side

    def _refuses_locked(self, node: str) -> bool:
        return self._stuck.get(node, 0) >= self.max_stuck

    def _refuse_locked(self, launch: PodLaunch) -> None:
        """Fail a launch to a node whose stuck threads reached the bound, without calling it."""
        why = (f"node {launch.node} has {self._stuck[launch.node]} launches stuck past the "
               f"{self.deadline_s:g} s launch deadline, so it is given no more until one returns; its "
               f"agent may be hung: check it, or drain the node (gpupool node drain {launch.node}).")
        self._failed.setdefault(_gang(launch), why)
        self._done.append(Outcome(launch, None, why))

    def _spawn_locked(self, node: str) -> None:
        """Start threads for `node` while its queue has more launches than free threads."""
        queue = self._queues.get(node)
        if not queue or self._refuses_locked(node):
            return
        threads = self._workers.get(node, 0)
        busy = sum(1 for launch, _ in self._begun.values() if launch.node == node)
        while threads < self.per_node and threads - busy < len(queue):
            threads += 1
            threading.Thread(target=self._serve, args=(node,), name=f"gpupool-launch-{node}",
                             daemon=True).start()
        self._workers[node] = threads

    def _serve(self, node: str) -> None:
        """One thread of `node`'s worker: launch from its queue until it is empty."""
        while True:
            with self._lock:
                queue = self._queues.get(node)
                if not queue:
                    self._workers[node] -= 1
                    return
                launch = queue.popleft()
                skip = self._failed.get(_gang(launch))
                if skip is None:
                    self._begun[launch.pod_id] = (launch, time.monotonic())
            outcome = Outcome(launch, None, skip) if skip is not None else self._call(launch)
            with self._lock:
                late = launch.pod_id in self._abandoned
                self._abandoned.discard(launch.pod_id)
                self._begun.pop(launch.pod_id, None)
                recovered = False
                if late:
                    recovered = self._refuses_locked(node)
                    self._stuck[node] -= 1
                    recovered = recovered and not self._refuses_locked(node)
            if late:  # already reported failed: whatever the provider made of it is stopped
                self._stop_quietly(launch.pod_id)
                if recovered:
                    log.warning("a stuck launch on node %s returned: it is given launches again", node)
                    self.on_stuck_change()
                return  # a fresh thread took this one's place at the deadline
            self._finish(launch, outcome)

    def _call(self, launch: PodLaunch) -> Outcome:
        if not self.may_launch():
            return Outcome(launch, None, NOT_LEADER)
        try:
            self.provider.launch(launch)
            if not self.may_launch():  # the leadership was lost during the call (a stopped leader):
                self.provider.stop(launch.pod_id, grace_s=0)  # the new leader places it again
                return Outcome(launch, None, NOT_LEADER)
            return Outcome(launch, self.clock())
        except GpupoolError as exc:
            log.warning("launch of pod %s (workload %s) failed: %s", launch.pod_id, launch.workload_id,
                        exc.message)
            return Outcome(launch, None, exc.message)
        except Exception:  # a bug or bad data in one launch must not abort the others
            log.exception("launch of pod %s (workload %s) raised", launch.pod_id, launch.workload_id)
            return Outcome(launch, None, INTERNAL)

    def _finish(self, launch: PodLaunch, outcome: Outcome) -> None:
        with self._lock:
            failed = outcome.started_s is None
            if failed:
                self._failed.setdefault(_gang(launch), outcome.why)
            self._done.append(outcome)
            last = not self._begun and not any(self._queues.values())
        # Wake the loop for a failure (its devices are free) or the last launch in flight: its launch
        # rest ends, and one record takes the batch (a wake for every outcome cost the launch threads
        # more than the rest saved: each wakes a thread waiting on the loop's event). Inline, the
        # caller records what came of its launches itself.
        if self.threaded and (failed or last):
            self.on_outcome()

    def _stop_quietly(self, pod_id: str) -> None:
        try:
            self.provider.stop(pod_id, grace_s=0)
        except Exception:
            log.exception("stopping pod %s after its late launch failed", pod_id)


def _gang(launch: PodLaunch) -> tuple[str, str]:
    """The gang a pod belongs to: its workload and the attempt it was placed for."""
    return launch.workload_id, launch.env.get("GPUPOOL_ATTEMPT", "")
