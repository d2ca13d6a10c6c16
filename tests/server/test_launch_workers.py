"""Launches run in per-node launch workers, outside the control loop: a node whose launch hangs holds
up neither the scheduling cycles nor the other nodes' launches, and its pod fails with a reason at
the launch deadline; a cancel that lands while a launch is in flight wins; a stop (cancel,
preemption, time limit, drain, requeue, a node that left) of a pod whose launch was not begun ends
the pod at once; a restart with launches in flight reconciles them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from storereads import StoreReads

from factories import ISSUE_CONFIG, node
from gpupool.api.workloads import WorkloadSpec
from gpupool.config import parse_config
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.fake import FakeProvider
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops.control import ControlLoop
from gpupool.server.runtime import Runtime
from gpupool.server.services import workloads
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

ADMIN = Principal("admin", None)
DEADLINE_S = 0.5
PATIENCE_S = 20.0
"""How long a test waits for something that happens in well under a second (a loaded machine)."""


class GatedProvider(FakeProvider):
    """A fake whose launches on the nodes in `gated` block until `gate` is set (a stuck agent); with
    `record_first`, the pod is recorded before the launch blocks (the provider took it, the answer is
    late). Thread-safe, so the server calls it from its launch workers."""

    concurrent_launch = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gated: set[str] = set()
        self.record_first = False
        self.blocked: list[str] = []
        self.released: set[str] = set()
        """Pods whose launch returns although the gate is closed."""
        self.stopped: list[str] = []
        self._lock = threading.RLock()

    def launch(self, pod: PodLaunch) -> None:
        if pod.node in self.gated:
            if self.record_first:
                with self._lock:
                    super().launch(pod)
            self.blocked.append(pod.pod_id)
            while not self.gate.wait(0.01) and pod.pod_id not in self.released:
                pass
        with self._lock:
            super().launch(pod)

    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        with self._lock:
            self.stopped.append(pod_id)
            super().stop(pod_id, grace_s)

    def poll(self) -> list[PodStatus]:
        with self._lock:
            return super().poll()

    def phase(self, pod_id: str) -> PodPhase | None:
        """The pod's phase now, whether or not poll() still lists it (an ended pod whose end the
        server stored is acknowledged, and poll() leaves it out); None before its launch returned."""
        with self._lock:
            pod = self._pods.get(pod_id)
            return None if pod is None else self._status(pod).phase


class Pool(StoreReads):
    def __init__(self, tmp_path: Path, provider: GatedProvider | None = None, *, nodes: str = "2x8xH100",
                 deadline_s: float = PATIENCE_S * 10, url: str = "") -> None:
        self.now = 1_000_000.0
        self.provider = provider or GatedProvider(nodes, clock=lambda: self.now, duration_s=10_000.0)
        self.url = url or f"sqlite:///{tmp_path / 'store.sqlite'}"
        settings = Settings(data_dir=tmp_path, database_url=self.url, cycle_interval_s=0.05,
                            launch_deadline_s=deadline_s)
        self.rt = Runtime(settings=settings, store=Store.open(self.url), provider=self.provider,
                          clock=lambda: self.now, config=parse_config(ISSUE_CONFIG))
        bootstrap(self.rt)
        self.loop = ControlLoop(self.rt)
        self.loop.recovered = self.loop.reconciler.recover()

    def submit(self, gpus: float, **extra: Any) -> str:
        spec = WorkloadSpec.model_validate({"command": ["train"], "resources": {"gpus": gpus}, **extra})
        return workloads.submit(self.rt, ADMIN, spec).id

    def step_until(self, what: str, done: Any) -> None:
        """Run steps (as the loop does) until `done()`; fail after PATIENCE_S of real time."""
        end = threading.Event()
        timer = threading.Timer(PATIENCE_S, end.set)
        timer.start()
        try:
            while not done():
                assert not end.is_set(), f"still waiting for {what} after {PATIENCE_S} s"
                step_bounded(self.loop)
                end.wait(0.01)
        finally:
            timer.cancel()


def step_bounded(loop: ControlLoop) -> None:
    """One step, which must return while a launch hangs (a step that waited on it would not)."""
    thread = threading.Thread(target=loop.step, daemon=True)
    thread.start()
    thread.join(PATIENCE_S)
    assert not thread.is_alive(), "the control loop's step waited on a hung launch"


@pytest.fixture
def pool(tmp_path: Path, db_url: str) -> Iterator[Pool]:
    """A pool whose launch deadline is never reached in a test (the test says when launches return),
    on SQLite and on PostgreSQL (whose transactions run concurrently: the records are compare-and-sets)."""
    made = Pool(tmp_path, url=db_url)
    yield made
    made.provider.gate.set()  # let the hung launch threads end
    made.rt.store.close()


@pytest.fixture
def short(tmp_path: Path) -> Iterator[Pool]:
    """A pool whose launch deadline is DEADLINE_S."""
    made = Pool(tmp_path, deadline_s=DEADLINE_S)
    yield made
    made.provider.gate.set()
    made.rt.store.close()


def test_a_hung_launch_on_one_node_holds_up_neither_the_cycles_nor_another_node(short: Pool) -> None:
    pool = short
    first = pool.submit(8)
    pool.step_until("the first workload to run", lambda: pool.row(first).status == "running")
    [pod] = pool.pods(first)
    stuck = pod.node
    pool.provider.gated.add(stuck)  # every launch on that node hangs from now on
    pool.now += 1.0

    second = pool.submit(8)  # lands on the other node (the first is full)
    pool.now += 1.0  # submitted after it (first in the queue's order)
    third = pool.submit(8)  # waits: no room
    pool.step_until("the second workload to be placed", lambda: pool.row(second).status != "pending")
    [second_pod] = pool.pods(second)
    assert second_pod.node != stuck
    pool.step_until("the second workload to run", lambda: pool.row(second).status == "running")

    workloads.cancel(pool.rt, ADMIN, first)  # room on the stuck node: the third goes there and hangs
    pool.step_until("the third workload's launch to begin", lambda: len(pool.provider.blocked) == 1)
    [hung] = pool.provider.blocked
    assert pool.pods(third)[0].node == stuck and pool.row(third).status == "admitted"
    looked_at: list[int] = []
    cycle = pool.loop.scheduler.cycle

    def counted(capacity_changed: bool = True) -> Any:
        stats = cycle(capacity_changed)
        looked_at.append(stats.pending)
        return stats

    pool.loop.scheduler.cycle = counted  # type: ignore[method-assign]
    pool.now += 1.0
    fourth = pool.submit(0.5)  # no room anywhere, but a cycle looks at it while the launch hangs
    pool.step_until("a cycle to look at the fourth", lambda: any(looked_at))
    assert pool.row(third).status == "admitted", "while the launch still hangs"

    pool.step_until("the hung launch's deadline", lambda: pool.row(third).status == "failed")
    to_status, reason, message = pool.events(third)[-1]
    assert (to_status, reason) == ("failed", "launch_failed")
    assert f"node {stuck} did not start it within {DEADLINE_S:g} s" in message
    [pod] = pool.pods(third)
    assert pod.status == "failed" and pod.started_s is None and pod.message.startswith("Never started: ")
    assert pool.row(fourth).status in ("pending", "admitted", "running")

    pool.provider.gate.set()  # the stuck agent answers at last: the pod it started is stopped

    pool.step_until("the late pod to be stopped", lambda: pool.provider.phase(hung) is PodPhase.STOPPED)
    assert pool.row(third).status == "failed", "the late answer changes nothing in the store"
    assert pool.pods(third)[0].status == "failed"


def test_the_running_loop_keeps_deciding_and_starting_work_while_a_node_hangs(tmp_path: Path) -> None:
    """The loop's own thread (its rests included), not only single steps: with every launch on one
    node hung, work submitted for the other node is placed and started."""
    pool = Pool(tmp_path)
    try:
        first = pool.submit(8)
        pool.step_until("the first workload to run", lambda: pool.row(first).status == "running")
        stuck = pool.pods(first)[0].node
        workloads.cancel(pool.rt, ADMIN, first)
        pool.step_until("its pod to end", lambda: pool.pods(first)[0].status == "stopped")
        pool.provider.gated.add(stuck)
        pool.loop.start()
        hung = pool.submit(8)
        wait_until("its launch to hang", lambda: len(pool.provider.blocked) == 1)
        assert pool.pods(hung)[0].node == stuck
        pool.now += 1.0
        later = [pool.submit(2) for _ in range(4)]  # only the other node has room
        wait_until("the later work to run", lambda: all(pool.row(w).status == "running" for w in later))
        assert pool.row(hung).status == "admitted", "still hung, and held nothing else up"
    finally:
        pool.provider.gate.set()
        pool.loop.stop()
        pool.rt.store.close()


def wait_until(what: str, done: Any) -> None:
    """Wait (the loop's thread does the work) until `done()`; fail after PATIENCE_S."""
    end = threading.Event()
    timer = threading.Timer(PATIENCE_S, end.set)
    timer.start()
    try:
        while not done():
            assert not end.is_set(), f"still waiting for {what} after {PATIENCE_S} s"
            end.wait(0.01)
    finally:
        timer.cancel()


def test_a_cancel_during_a_launch_wins(pool: Pool) -> None:
    pool.provider.gated.update(n.name for n in pool.provider.nodes())
    workload_id = pool.submit(1)
    step_bounded(pool.loop)
    pool.step_until("the launch to begin", lambda: len(pool.provider.blocked) == 1)
    workloads.cancel(pool.rt, ADMIN, workload_id)
    assert pool.row(workload_id).status == "cancelled"
    [pod] = pool.pods(workload_id)
    assert pod.status == "stopping", "handed to the provider: stopped once its launch returns"
    pool.provider.gate.set()  # the launch returns: the pod started
    pool.step_until("the started pod to be stopped", lambda: pod.id in pool.provider.stopped
                    and pool.pods(workload_id)[0].status == "stopped")
    row = pool.row(workload_id)
    assert row.status == "cancelled" and row.started_s is None, "the late start did not revive it"
    [pod] = pool.pods(workload_id)
    assert pod.started_s is not None, "metered from its real start up to its stop"
    assert [e[0] for e in pool.events(workload_id)][-1] == "cancelled"


def test_a_cancel_of_a_pod_whose_launch_was_not_begun_ends_it_at_once(tmp_path: Path) -> None:
    pool = Pool(tmp_path, nodes="1x8xH100")
    try:
        pool.loop.scheduler.launches.per_node = 1  # one launch at a time on the node
        pool.provider.gated.update(n.name for n in pool.provider.nodes())
        first = pool.submit(4)
        second = pool.submit(4)
        step_bounded(pool.loop)
        assert pool.row(first).status == pool.row(second).status == "admitted"
        pool.step_until("a launch to begin", lambda: len(pool.provider.blocked) == 1)
        [begun] = pool.provider.blocked
        queued = second if begun.startswith(first) else first
        answer = workloads.cancel(pool.rt, ADMIN, queued)
        assert answer.status == "cancelled"
        [pod] = pool.pods(queued)
        assert pod.status == "stopped" and pod.finished_s == pool.now, "ended at once, not left stopping"
        assert pod.message == "Stopped before it started." and pod.started_s is None
        pool.provider.gate.set()
        pool.step_until("the begun launch to be recorded", lambda: not pool.loop.scheduler.launches.busy)
        assert pool.provider.phase(pod.id) is None, "never handed to the provider"
        assert pool.row(second if queued == first else first).status == "running"
        assert pool.pods(queued)[0].status == "stopped"
    finally:
        pool.provider.gate.set()
        pool.rt.store.close()


def queued_behind_a_hung_launch(pool: Pool, **extra: Any) -> tuple[str, str]:
    """On a one-node pool whose node launches one pod at a time and hangs: a high-priority workload
    whose launch has begun (and hangs), then a 4-GPU one (`extra`) whose launch is queued behind it.
    Returns (the hung one, the queued one)."""
    pool.loop.scheduler.launches.per_node = 1
    pool.provider.gated.update(n.name for n in pool.provider.nodes())
    hung = pool.submit(4, priority_class="high")
    pool.step_until("the first launch to begin", lambda: len(pool.provider.blocked) == 1)
    pool.now += 1.0
    queued = pool.submit(4, **extra)
    pool.step_until("the second to be placed", lambda: pool.row(queued).status == "admitted")
    step_bounded(pool.loop)
    assert pool.provider.blocked == [pool.pods(hung)[0].id], "the second's launch waits in the queue"
    assert pool.pods(queued)[0].id in pool.loop.scheduler.launches.in_flight()
    return hung, queued


def assert_taken_back(pool: Pool, workload_id: str, at: float) -> None:
    """The workload's only pod ended at `at` without ever reaching the provider."""
    [pod] = pool.pods(workload_id)
    assert (pod.status, pod.message) == ("stopped", "Stopped before it started.")
    assert pod.finished_s == at and pod.started_s is None
    assert pod.id not in pool.provider.stopped, "nothing to ask the provider: it never had it"
    assert pod.id not in pool.provider.blocked and pool.provider.phase(pod.id) is None, "never launched"
    assert pod.id not in pool.loop.scheduler.launches.in_flight()


def test_a_preempted_pod_whose_launch_was_not_begun_is_taken_back_and_its_preemptor_starts(
        tmp_path: Path) -> None:
    """The victim's launch waits behind a hung one: it is taken back (it never starts only to be
    stopped), and the preemptor waiting on its devices is launched without waiting for the hung one."""
    pool = Pool(tmp_path, nodes="1x8xH100")
    try:
        hung, victim = queued_behind_a_hung_launch(pool, priority_class="low")
        pool.now += 1.0
        preemptor = pool.submit(4, priority_class="high")
        preempted_at = pool.now
        pool.step_until("the victim to be preempted", lambda: pool.row(victim).status == "pending")
        assert_taken_back(pool, victim, preempted_at)
        [waiting] = pool.pods(preemptor)
        pool.provider.released.add(waiting.id)  # its node answers this launch at once
        pool.loop.scheduler.launches.per_node = 2  # room for a launch beside the hung one
        pool.step_until("the preemptor to run", lambda: pool.row(preemptor).status == "running")
        assert pool.provider.phase(waiting.id) is PodPhase.RUNNING
        assert pool.row(hung).status == "admitted", "while the first launch still hangs"
        assert pool.row(victim).status == "pending" and pool.pods(victim)[0].status == "stopped"
    finally:
        pool.provider.gate.set()
        pool.rt.store.close()


def test_a_drained_pod_whose_launch_was_not_begun_is_taken_back(tmp_path: Path) -> None:
    from gpupool.server.services import nodes

    pool = Pool(tmp_path, nodes="1x8xH100")
    try:
        hung, queued = queued_behind_a_hung_launch(pool)
        [hung_pod] = pool.pods(hung)
        pool.now += 1.0
        nodes.drain(pool.rt, ADMIN, hung_pod.node, now=True)
        assert_taken_back(pool, queued, pool.now)
        assert pool.row(queued).status == "pending"
        assert pool.pods(hung)[0].status == "stopping", "begun: the provider is asked to stop it"
        pool.provider.gate.set()
        pool.step_until("the begun launch to be recorded", lambda: not pool.loop.scheduler.launches.busy)
        assert pool.provider.phase(pool.pods(queued)[0].id) is None, "never handed to the provider"
    finally:
        pool.provider.gate.set()
        pool.rt.store.close()


def test_a_requeued_pod_whose_launch_was_not_begun_is_taken_back(tmp_path: Path) -> None:
    from gpupool.server.services import jobs

    pool = Pool(tmp_path, nodes="1x8xH100")
    try:
        _, queued = queued_behind_a_hung_launch(pool)
        pool.now += 1.0
        assert jobs.requeue(pool.rt, ADMIN, queued).status == "pending"
        assert_taken_back(pool, queued, pool.now)
    finally:
        pool.provider.gate.set()
        pool.rt.store.close()


def test_a_pod_whose_launch_was_not_begun_is_taken_back_at_its_workloads_time_limit(tmp_path: Path) -> None:
    """A gang whose pod on one node started while its pod on the other waits behind a hung launch:
    at the time limit the waiting one is taken back, the started one is stopped by the provider."""
    pool = Pool(tmp_path)
    try:
        pool.loop.scheduler.launches.per_node = 1
        pool.provider.gated.update(n.name for n in pool.provider.nodes())
        hung = pool.submit(2, priority_class="high")
        pool.step_until("the first launch to begin", lambda: len(pool.provider.blocked) == 1)
        stuck = pool.pods(hung)[0].node
        pool.provider.gated = {stuck}
        pool.now += 1.0
        timed = pool.submit(6, replicas=2, time_limit_s=60)  # 6 + 6 GPUs: one pod on each node
        pool.step_until("the timed gang to run", lambda: pool.row(timed).status == "running")
        pods = {p.node: p for p in pool.pods(timed)}
        assert pods[stuck].status == "launching" and pods[stuck].id not in pool.provider.blocked
        [(_, started)] = [(node, p) for node, p in pods.items() if node != stuck]
        assert started.status == "running"
        pool.now += 61.0
        limit_at = pool.now
        pool.step_until("the time limit", lambda: pool.row(timed).status == "failed")
        [queued] = [p for p in pool.pods(timed) if p.node == stuck]
        assert (queued.status, queued.message) == ("stopped", "Stopped before it started.")
        assert queued.finished_s == limit_at and queued.started_s is None
        assert queued.id not in pool.provider.stopped and pool.provider.phase(queued.id) is None
        assert started.id in pool.provider.stopped, "the started pod is stopped by the provider"
    finally:
        pool.provider.gate.set()
        pool.rt.store.close()


def test_a_gangs_pod_whose_launch_was_not_begun_is_taken_back_when_another_node_leaves(
        tmp_path: Path) -> None:
    """A gang with a pod on each node: one waits behind a hung launch on its node, the other's launch
    hangs on a node that then leaves the pool. The gang is requeued (node_lost); its pod still queued
    is ended at once and never handed to the provider."""
    pool = Pool(tmp_path)
    try:
        pool.loop.scheduler.launches.per_node = 1
        pool.provider.gated.update(n.name for n in pool.provider.nodes())
        hung = pool.submit(2, priority_class="high")
        pool.step_until("the first launch to begin", lambda: len(pool.provider.blocked) == 1)
        stuck = pool.pods(hung)[0].node
        pool.now += 1.0
        gang = pool.submit(6, replicas=2)  # 6 + 6 GPUs: one pod on each node
        pool.step_until("the gang's other launch to begin", lambda: len(pool.provider.blocked) == 2)
        pods = {p.node: p for p in pool.pods(gang)}
        queued = pods[stuck]
        [(gone, lost)] = [(node, p) for node, p in pods.items() if node != stuck]
        assert queued.id in pool.loop.scheduler.launches.in_flight() and lost.id in pool.provider.blocked
        pool.now += 1.0
        left_at = pool.now
        assert pool.loop.reconciler.nodes_gone([n for n in pool.provider.nodes() if n.name != gone]) == 1
        assert pool.row(gang).status == "pending" and pool.row(gang).reason == "node_lost"
        [after] = [p for p in pool.pods(gang) if p.id == queued.id]
        assert (after.status, after.message) == ("stopped", "Stopped before it started.")
        assert after.finished_s == left_at and after.started_s is None
        assert queued.id not in pool.provider.stopped, "nothing to ask the provider: it never had it"
        assert queued.id not in pool.loop.scheduler.launches.in_flight()
        pool.provider.gate.set()
        pool.step_until("the begun launches to be recorded", lambda: not pool.loop.scheduler.launches.busy)
        assert queued.id not in pool.provider.blocked and pool.provider.phase(queued.id) is None
    finally:
        pool.provider.gate.set()
        pool.rt.store.close()


def test_a_late_start_of_an_attempt_the_workload_left_does_not_start_the_next(pool: Pool) -> None:
    """The outcome is recorded against the pod's own attempt: a requeued workload, placed again and
    launching, is not marked running by its old pod's start."""
    from gpupool.server.services import nodes

    pool.provider.gated.update(n.name for n in pool.provider.nodes())
    workload_id = pool.submit(8)
    pool.step_until("its first launch to begin", lambda: len(pool.provider.blocked) == 1)
    [old_pod] = pool.provider.blocked
    first_node = pool.pods(workload_id)[0].node
    nodes.drain(pool.rt, ADMIN, first_node, now=True)  # requeued while its launch is in flight
    pool.now += 1.0
    pool.step_until("its second launch to begin", lambda: len(pool.provider.blocked) == 2)
    row = pool.row(workload_id)
    assert (row.status, row.attempt) == ("admitted", 2)
    pool.provider.released.add(old_pod)  # the old attempt's launch returns: that pod started
    pool.step_until("the old pod to be stopped", lambda: pool.provider.phase(old_pod) is PodPhase.STOPPED)
    row = pool.row(workload_id)
    assert (row.status, row.started_s) == ("admitted", None), "its new attempt has not started"
    pool.provider.gate.set()
    pool.step_until("the new attempt to run", lambda: pool.row(workload_id).status == "running")
    assert pool.row(workload_id).attempt == 2


def test_a_pod_that_ends_before_its_launch_returns_is_settled_after_its_start(tmp_path: Path) -> None:
    """The provider reports the pod ended while the server still waits for the launch call: its end
    is applied once the start is recorded, so the workload ran (and is metered) before it succeeded."""
    pool = Pool(tmp_path)
    try:
        pool.provider.duration_s = 0.0  # the pod ends as soon as it starts
        pool.provider.gated.update(n.name for n in pool.provider.nodes())
        pool.provider.record_first = True
        workload_id = pool.submit(1)
        pool.step_until("the launch to begin", lambda: len(pool.provider.blocked) == 1)
        [pod_id] = pool.provider.blocked
        assert {s.pod_id: s.phase for s in pool.provider.poll()}[pod_id] is PodPhase.SUCCEEDED
        for _ in range(3):
            step_bounded(pool.loop)
        assert pool.row(workload_id).status == "admitted", "its end waits for its start"
        pool.provider.gate.set()
        pool.step_until("it to succeed", lambda: pool.row(workload_id).status == "succeeded")
        row = pool.row(workload_id)
        assert row.started_s is not None and row.finished_s is not None
        moves = [(to, reason) for to, reason, _ in pool.events(workload_id)]
        assert moves == [("pending", "submitted"), ("admitted", "admitted"), ("running", "launched"),
                         ("succeeded", "completed")]
        [pod] = pool.pods(workload_id)
        assert pod.status == "succeeded" and pod.started_s is not None
    finally:
        pool.provider.gate.set()
        pool.rt.store.close()


@pytest.mark.parametrize("provider_took_it", [True, False])
def test_a_restart_with_a_launch_in_flight_reconciles_it(tmp_path: Path, provider_took_it: bool) -> None:
    old = Pool(tmp_path)
    try:
        old.provider.gated.update(n.name for n in old.provider.nodes())
        old.provider.record_first = provider_took_it
        workload_id = old.submit(2)
        step_bounded(old.loop)
        old.step_until("the launch to begin", lambda: len(old.provider.blocked) == 1)
        assert [p.status for p in old.pods(workload_id)] == ["launching"]
        # The server dies here (its launch thread never answers); a new one starts over the same
        # store and the same provider state (the local provider keeps its pods in files).
        old.rt.store.close()
        new = Pool(tmp_path, provider=old.provider)
        new.now = old.now + 5.0
        new.loop.recovered = new.loop.reconciler.recover()
        row = new.row(workload_id)
        [pod] = new.pods(workload_id)
        if provider_took_it:
            assert row.status == "running" and pod.status == "running", "re-adopted, never started twice"
            assert pod.started_s is not None
        else:
            assert row.status == "pending" and pod.status == "lost"
            assert new.events(workload_id)[-1][1] == "requeued_on_restart"
            new.provider.gated.clear()
            new.step_until("it to be placed again and run", lambda: new.row(workload_id).status == "running")
        new.rt.store.close()
    finally:
        old.provider.gate.set()


def test_the_launch_deadline_is_a_setting_with_a_sentence_for_bad_values() -> None:
    from gpupool.errors import InvalidInput

    assert Settings().launch_deadline_s == 30.0
    assert Settings().with_env({"GPUPOOL_LAUNCH_DEADLINE_S": "12.5"}).launch_deadline_s == 12.5
    for bad, said in (("soon", "must be a number of seconds"), ("0", "must be a positive number"),
                      ("nan", "must be a positive number")):
        with pytest.raises(InvalidInput, match=said):
            Settings().with_env({"GPUPOOL_LAUNCH_DEADLINE_S": bad})


def test_a_failed_pod_skips_its_own_gangs_queued_pods_not_the_next_attempts() -> None:
    """Pods of a gang whose pod failed are not launched (the gang fails anyway); a pod of the
    workload's next attempt, handed over before that failure was recorded, is another gang."""
    from gpupool.errors import ProviderError
    from gpupool.server.loops.launches import LaunchWorkers

    class Refusing(FakeProvider):
        def launch(self, pod: PodLaunch) -> None:
            if pod.env.get("GPUPOOL_ATTEMPT") == "1" and pod.rank == 0:
                raise ProviderError("node n0 refused it.")
            super().launch(pod)

    provider = Refusing("1x8xH100")
    node = provider.nodes()[0].name
    workers = LaunchWorkers(provider, lambda: 5.0)

    def pod(attempt: int, rank: int) -> PodLaunch:
        return PodLaunch(pod_id=f"w-1-a{attempt}-r{rank}", workload_id="w-1", node=node, command=("true",),
                         rank=rank, world_size=2, env={"GPUPOOL_ATTEMPT": str(attempt)})

    workers.submit([pod(1, 0), pod(1, 1)])
    workers.submit([pod(2, 0)])  # the next attempt, before the failure was collected
    outcomes = {o.launch.pod_id: o for o in workers.collect()}
    assert outcomes["w-1-a1-r0"].why == "node n0 refused it."
    assert outcomes["w-1-a1-r1"].why == "node n0 refused it." and outcomes["w-1-a1-r1"].started_s is None
    assert outcomes["w-1-a2-r0"].started_s == 5.0, "launched: another attempt"
    assert {s.pod_id for s in provider.poll()} == {"w-1-a2-r0"}


def _launch(node: str, n: int) -> PodLaunch:
    return PodLaunch(pod_id=f"w{n}-a1-r0", workload_id=f"w{n}", node=node, command=("train",),
                     env={"GPUPOOL_ATTEMPT": "1"})


def _threads_of(node: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name == f"gpupool-launch-{node}")


def test_a_node_whose_launches_hang_holds_a_bounded_number_of_threads_and_recovers() -> None:
    """Every launch on one node hangs: past the deadline each thread is stuck, and once the node has
    `max_stuck` of them it is given no more (its queued and later launches fail at once with a
    sentence naming it), while the other node keeps launching. When a stuck call returns the node
    takes launches again."""
    from gpupool.server.loops.launches import LaunchWorkers

    hung, other = "bounded-hung", "bounded-other"  # names no other test's launch threads carry
    provider = GatedProvider([node(hung), node(other)], duration_s=10_000.0)
    provider.gated = {hung}
    changes = threading.Event()
    workers = LaunchWorkers(provider, lambda: 0.0, deadline_s=DEADLINE_S, per_node=1, max_stuck=2)
    workers.on_stuck_change = changes.set
    try:
        workers.submit([_launch(hung, n) for n in range(6)] + [_launch(other, 10), _launch(other, 11)])
        outcomes: dict[str, Any] = {}

        def decided(ids: set[str]) -> Any:
            def check() -> bool:
                outcomes.update((o.launch.pod_id, o) for o in workers.collect())
                return ids <= set(outcomes)
            return check

        wait_until("every launch to be decided", decided({f"w{n}-a1-r0" for n in (*range(6), 10, 11)}))
        assert outcomes["w10-a1-r0"].started_s is not None and outcomes["w11-a1-r0"].started_s is not None
        assert provider.blocked == ["w0-a1-r0", "w1-a1-r0"], "two calls stuck; the node got no third"
        for n in (0, 1):
            assert "within 0.5 s (the server's launch deadline)" in outcomes[f"w{n}-a1-r0"].why
        refused = (f"node {hung} has 2 launches stuck past the 0.5 s launch deadline, so it is given no "
                   f"more until one returns; its agent may be hung: check it, or drain the node "
                   f"(gpupool node drain {hung}).")
        assert [outcomes[f"w{n}-a1-r0"].why for n in range(2, 6)] == [refused] * 4
        assert _threads_of(hung) == 2, "only the stuck threads: none serves the node any more"
        assert workers.stuck() == {hung: 2} and workers.stuck_nodes() == {hung}
        assert changes.is_set()
        changes.clear()
        workers.submit([_launch(hung, 20), _launch(other, 21)])  # a later launch there: refused at once
        wait_until("the later launches", decided({"w20-a1-r0", "w21-a1-r0"}))
        assert outcomes["w20-a1-r0"].why == refused and outcomes["w21-a1-r0"].started_s is not None
        assert len(provider.blocked) == 2 and _threads_of(hung) == 2
        provider.released.add("w0-a1-r0")  # one stuck call returns
        wait_until("the node to take launches again", changes.is_set)
        assert workers.stuck() == {hung: 1} and workers.stuck_nodes() == frozenset()
        assert "w0-a1-r0" in provider.stopped, "its late start is stopped: it was reported failed"
        provider.gated.clear()
        workers.submit([_launch(hung, 30)])
        wait_until("a launch on the recovered node", decided({"w30-a1-r0"}))
        assert outcomes["w30-a1-r0"].started_s is not None
    finally:
        provider.gate.set()
    wait_until("the stuck threads to end once their calls return", lambda: _threads_of(hung) == 0)
    assert workers.stuck() == {hung: 0}


def test_the_scheduler_places_no_work_on_a_node_whose_launches_are_stuck(tmp_path: Path) -> None:
    """With its launch threads stuck, a node is as if cordoned: new work goes to the other node or
    waits, none is placed there to fail; /metrics counts the stuck threads; once a stuck call returns
    the waiting work is placed there."""
    from gpupool.server.metrics import Metrics

    pool = Pool(tmp_path, deadline_s=DEADLINE_S)
    try:
        metrics = Metrics(pool.rt)
        pool.loop.scheduler.launches.per_node = 1
        pool.loop.scheduler.launches.max_stuck = 1
        pool.provider.gated.update(n.name for n in pool.provider.nodes())
        first = pool.submit(8)
        pool.step_until("the first launch to begin", lambda: len(pool.provider.blocked) == 1)
        [pod] = pool.pods(first)
        pool.provider.gated = {pod.node}
        pool.step_until("the launch deadline", lambda: pool.row(first).status == "failed")
        assert metrics.registry.get_sample_value("gpupool_launch_threads_stuck", {"node": pod.node}) == 1
        pool.now += 1.0
        placed, waits = pool.submit(8), pool.submit(8)
        pool.step_until("one to run", lambda: "running" in {pool.row(placed).status, pool.row(waits).status})
        step_bounded(pool.loop)
        [(running, _)] = [(w, s) for w in (placed, waits) if (s := pool.row(w).status) == "running"]
        [waiting] = [w for w in (placed, waits) if w != running]
        assert pool.pods(running)[0].node != pod.node
        assert pool.row(waiting).status == "pending" and pool.pods(waiting) == []
        pool.provider.gated.clear()
        pool.provider.released.add(pod.id)  # the stuck call returns
        pool.step_until("the waiting one to run there", lambda: pool.row(waiting).status == "running")
        assert pool.pods(waiting)[0].node == pod.node
        assert metrics.registry.get_sample_value("gpupool_launch_threads_stuck", {"node": pod.node}) == 0
    finally:
        pool.provider.gate.set()
        pool.rt.store.close()
