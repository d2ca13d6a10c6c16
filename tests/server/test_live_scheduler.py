"""The live loop carries out the whole cycle: preemption, eviction, requeues, retries, time limits,
reservations and pods waiting for their devices; driven step by step on a virtual clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from factories import ISSUE_CONFIG
from gpupool.api.workloads import WorkloadSpec
from gpupool.config import parse_config
from gpupool.core.model import WorkloadStatus
from gpupool.providers.fake import FakeProvider
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops.control import ControlLoop
from gpupool.server.orm import EventRow, PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import workloads
from gpupool.server.services.events import IllegalMove, transition
from gpupool.server.services.specs import to_workload
from gpupool.server.settings import Settings
from gpupool.server.states import PodState, pod_move_allowed, workload_move_allowed

ADMIN = Principal("admin", None)



class Pool:
    """A server's control loop on a fake provider and a clock the test moves."""

    def __init__(self, tmp_path: Path, config: str = ISSUE_CONFIG, nodes: str = "1x2xH100") -> None:
        self.now = 1_000_000.0
        self.provider = FakeProvider(nodes, clock=lambda: self.now, duration_s=10_000.0)
        url = f"sqlite:///{tmp_path / 'store.sqlite'}"
        settings = Settings(data_dir=tmp_path, database_url=url, cycle_interval_s=0.05)
        self.rt = Runtime(settings=settings, store=Store.open(url), provider=self.provider,
                          clock=lambda: self.now, config=parse_config(config))
        from gpupool.server.services.tenants import bootstrap

        self.token = bootstrap(self.rt) or ""
        self.loop = ControlLoop(self.rt)
        self.loop.recovered = self.loop.reconciler.recover()

    def submit(self, gpus: float = 1, **extra: Any) -> str:
        spec = WorkloadSpec.model_validate({"command": ["train"], "resources": {"gpus": gpus}, **extra})
        return workloads.submit(self.rt, ADMIN, spec).id

    def step(self, advance_s: float = 0.0) -> None:
        self.now += advance_s
        self.loop.step()

    def row(self, workload_id: str) -> WorkloadRow:
        with self.rt.store.read() as session:
            row = session.get(WorkloadRow, workload_id)
            assert row is not None
            session.expunge(row)
            return row

    def status(self, workload_id: str) -> str:
        return self.row(workload_id).status

    def pods(self, workload_id: str) -> list[tuple[str, int, str]]:
        with self.rt.store.read() as session:
            return [(p.id, p.attempt, p.status) for p in session.scalars(
                select(PodRow).where(PodRow.workload_id == workload_id).order_by(PodRow.id))]

    def events(self, workload_id: str) -> list[tuple[str, str, str]]:
        with self.rt.store.read() as session:
            return [(e.to_status, e.reason, e.message) for e in session.scalars(
                select(EventRow).where(EventRow.workload_id == workload_id).order_by(EventRow.id))]

    def close(self) -> None:
        self.rt.store.close()


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    made = Pool(tmp_path)
    yield made
    made.close()


def test_preemption_stops_the_victim_with_its_class_grace_and_requeues_it(pool: Pool) -> None:
    low = [pool.submit(priority_class="low", env={"GPUPOOL_FAKE_IGNORE_TERM": "1"}) for _ in range(2)]
    pool.step()
    assert [pool.status(w) for w in low] == ["running", "running"]
    pool.step(100.0)
    high = pool.submit(priority_class="high")
    pool.step()
    victims = [w for w in low if pool.status(w) == "pending"]
    assert len(victims) == 1, "one device is enough for the preemptor"
    victim = victims[0]
    to_status, reason, message = pool.events(victim)[-1]
    assert (to_status, reason) == ("pending", "preempted")
    assert high in message and "100 GPU-seconds of work lost" in message
    assert pool.row(victim).lost_device_s == pytest.approx(100.0)
    assert pool.row(victim).run_s == pytest.approx(100.0)
    # the victim ignores SIGTERM: its pod keeps the device for the class's 5 s grace, and the
    # preemptor is placed (it holds the slices) but waits to start until the victim has gone
    (_, _, state) = pool.pods(victim)[0]
    assert state == PodState.STOPPING.value
    assert pool.status(high) == "admitted" and pool.pods(high)[0][2] == PodState.WAITING.value
    assert high + "-a1-r0" not in {s.pod_id for s in pool.provider.poll()}, "not launched yet"
    pool.step(4.0)
    assert pool.pods(high)[0][2] == PodState.WAITING.value
    pool.step(1.5)  # past the grace: SIGKILL
    assert pool.pods(victim)[0][2] == PodState.STOPPED.value
    assert pool.status(high) == "running"
    # the victim runs again (attempt 2) once there is room
    for workload_id in [w for w in low if w != victim] + [high]:
        pool.provider.stop(f"{workload_id}-a1-r0", grace_s=0)
        pool.step()
    pool.step()
    assert pool.status(victim) == "running" and pool.row(victim).attempt == 2
    assert [p[1] for p in pool.pods(victim)] == [1, 2]


def test_a_pod_sees_its_grace_and_attempt(pool: Pool) -> None:
    workload_id = pool.submit(priority_class="low")
    pool.step()
    env = pool.provider._pods[f"{workload_id}-a1-r0"].launch.env
    assert env["GPUPOOL_PREEMPT_GRACE_S"] == "5" and env["GPUPOOL_ATTEMPT"] == "1"


def test_lost_work_counts_from_the_last_checkpoint(pool: Pool) -> None:
    low = [pool.submit(priority_class="low", env={"GPUPOOL_FAKE_CHECKPOINT_S": "30"}) for _ in range(2)]
    pool.step()
    pool.step(100.0)  # checkpoints at 30, 60, 90: 10 s lost
    pool.submit(priority_class="high")
    pool.step()
    victim = next(w for w in low if pool.status(w) == "pending")
    row = pool.row(victim)
    assert row.lost_device_s == pytest.approx(10.0) and row.progress_s == pytest.approx(90.0)
    assert "since its last checkpoint" in pool.events(victim)[-1][2]


def test_an_unhealthy_device_evicts_its_work_which_runs_elsewhere(tmp_path: Path) -> None:
    pool = Pool(tmp_path, nodes="2x1xH100")
    try:
        first = pool.submit()
        pool.step()
        (pod_id, _, _) = pool.pods(first)[0]
        node = pool.provider._pods[pod_id].launch.node
        device = pool.provider.nodes()[[n.name for n in pool.provider.nodes()].index(node)].devices[0]
        pool.step(50.0)
        pool.provider.inject_fault(node, device.uuid)
        pool.step()
        assert any(reason == "evicted_unhealthy" for _, reason, _ in pool.events(first))
        assert pool.row(first).lost_device_s == pytest.approx(50.0)
        pool.step()
        assert pool.status(first) == "running" and pool.row(first).attempt == 2
        (_, _, second_pod_state), = [p for p in pool.pods(first) if p[1] == 2]
        second = pool.provider._pods[f"{first}-a2-r0"].launch.node
        assert second != node and second_pod_state == "running"
    finally:
        pool.close()


def test_a_node_that_leaves_the_pool_requeues_its_work(tmp_path: Path) -> None:
    pool = Pool(tmp_path, nodes="2x1xH100")
    try:
        first = pool.submit()
        pool.step()
        node = pool.provider._pods[f"{first}-a1-r0"].launch.node
        del pool.provider._nodes[node]
        pool.step()
        pool.step()
        assert [(a, s) for _, a, s in pool.pods(first)] == [(1, "lost"), (2, "running")]
        assert any(reason == "node_lost" for _, reason, _ in pool.events(first))
    finally:
        pool.close()


def test_failed_pods_are_retried_with_backoff_then_fail(pool: Pool) -> None:
    failing = {"GPUPOOL_FAKE_EXIT_CODE": "3", "GPUPOOL_FAKE_DURATION_S": "1"}
    workload_id = pool.submit(max_retries=2, env=failing)
    pool.step()
    pool.step(1.0)  # exits 3: retry 1 of 2, after a 10 s backoff
    assert pool.status(workload_id) == "pending" and pool.row(workload_id).retries == 1
    assert "retry 1 of 2 in 10s" in pool.events(workload_id)[-1][2]
    pool.step(5.0)
    assert pool.status(workload_id) == "pending", "still within its backoff"
    pool.step(5.0)
    assert pool.status(workload_id) == "running"
    pool.step(1.0)  # retry 2 of 2, backoff doubled
    assert "retry 2 of 2 in 20s" in pool.events(workload_id)[-1][2]
    pool.step(20.0)
    pool.step(1.0)
    assert pool.status(workload_id) == "failed"
    assert pool.events(workload_id)[-1][2] == "Pod r0 exited with code 3 (after 2 retries)."


def test_without_retries_a_failed_pod_fails_the_workload(pool: Pool) -> None:
    workload_id = pool.submit(env={"GPUPOOL_FAKE_EXIT_CODE": "1", "GPUPOOL_FAKE_DURATION_S": "1"})
    pool.step()
    pool.step(1.0)
    assert pool.status(workload_id) == "failed" and pool.row(workload_id).retries == 0


def test_the_time_limit_stops_the_pod_and_fails_the_workload(pool: Pool) -> None:
    workload_id = pool.submit(time_limit_s=60)
    pool.step()
    pool.step(59.0)
    assert pool.status(workload_id) == "running"
    pool.step(1.0)
    row = pool.row(workload_id)
    assert (row.status, row.reason) == ("failed", "time_limit")
    assert "time limit of 1m" in row.message
    pool.step()
    assert pool.pods(workload_id)[0][2] == "stopped"


def test_backfill_reservation_is_stored_for_the_head(tmp_path: Path) -> None:
    pool = Pool(tmp_path, nodes="1x4xH100")
    running = pool.submit(gpus=2, time_limit_s=3600)
    pool.step()
    pool.step(1.0)  # submitted later than `running` (equal times would order by the random ids)
    head = pool.submit(gpus=4)  # waits for `running` to end
    pool.step(1.0)
    assert pool.status(head) == "pending"
    reserved = pool.row(head).reserved_start_s
    assert reserved is not None and reserved == pytest.approx(pool.row(running).started_s + 3600, abs=1)
    pool.step(1.0)
    short = pool.submit(gpus=1, time_limit_s=600)  # ends before the reservation: backfilled
    long = pool.submit(gpus=1, time_limit_s=7200)  # would delay the head
    pool.step()
    assert pool.status(short) == "running"
    assert pool.status(long) == "pending" and pool.row(long).reason == "backfill_blocked"
    workloads.cancel(pool.rt, ADMIN, head)
    pool.step()
    assert pool.row(head).reserved_start_s is None
    pool.close()


def test_the_transition_table_refuses_illegal_moves(pool: Pool) -> None:
    assert workload_move_allowed("running", "pending") and not workload_move_allowed("succeeded", "running")
    assert pod_move_allowed("waiting", "launching") and not pod_move_allowed("stopped", "running")
    workload_id = pool.submit()
    with pytest.raises(IllegalMove), pool.rt.store.write() as session:
        row = session.get(WorkloadRow, workload_id)
        assert row is not None
        transition(session, row, WorkloadStatus.SUCCEEDED.value, "completed", "never ran", pool.now)
    assert pool.status(workload_id) == "pending", "the illegal move was rolled back"


def test_an_illegal_pod_move_is_refused(pool: Pool) -> None:
    workload_id = pool.submit()
    pool.step()
    pool.provider.stop(f"{workload_id}-a1-r0", grace_s=0)
    pool.step()
    with pytest.raises(IllegalMove), pool.rt.store.write() as session:
        pod = session.get(PodRow, f"{workload_id}-a1-r0")
        assert pod is not None and pod.status == "stopped"
        pod.status = PodState.RUNNING.value


def test_the_running_pool_says_which_configuration_it_runs(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from gpupool.server.app import create_app

    pool = Pool(tmp_path)
    try:
        with TestClient(create_app(pool.rt)) as client:
            answer = client.get("/api/v1/config", headers={"Authorization": f"Bearer {pool.token}"})
            assert answer.status_code == 200, answer.text
            effective = answer.json()
            assert effective["scheduling"]["ordering"] == "drf" and effective["scheduling"]["preemption"]
            assert [c["name"] for c in effective["priority_classes"]] == ["low", "high"]
            assert effective["priority_classes"][0]["grace"] == 5.0
            assert client.get("/api/v1/config").status_code == 401
    finally:
        pool.close()


def test_history_estimates_are_kept_by_tenant_queue_and_shape_across_a_restart(pool: Pool) -> None:
    """A 2-GPU job ran 300 s. After a restart the loop reads its history back from the store whole
    (queue and pods): the next 2-GPU job of that queue is estimated at 300 s, a 1-GPU job of the
    same tenant and queue has no estimate (its kind never ran)."""
    done = pool.submit(gpus=2, env={"GPUPOOL_FAKE_DURATION_S": "300"})
    pool.step()
    assert pool.status(done) == "running"
    pool.step(301.0)
    pool.step()
    assert pool.status(done) == "succeeded"
    restarted = ControlLoop(pool.rt)
    restarted.recovered = restarted.reconciler.recover()
    restarted.step()
    scheduler = restarted.scheduler
    two = WorkloadSpec.model_validate({"command": ["train"], "resources": {"gpus": 2}})
    one = WorkloadSpec.model_validate({"command": ["train"], "resources": {"gpus": 1}})
    estimate = scheduler.estimator.history_s(to_workload("x", two, "default", 0, 0.0))
    assert estimate == pytest.approx(300.0, abs=1.0)
    assert scheduler.estimator.history_s(to_workload("y", one, "default", 0, 0.0)) is None


def test_a_reserved_start_slides_by_the_correction_of_the_run_it_waits_on_and_metrics_count_it(
    tmp_path: Path,
) -> None:
    """Two GPUs, both held by a run estimated at 100 s; the head (2 GPUs, the same class: it cannot
    preempt it) is reserved for that run's end. Once the run passes it, its estimate doubled puts
    the head at 200 s: one slide of 100 s, stored for `gpupool show` and counted on /metrics."""
    from gpupool.server.metrics import Metrics

    pool = Pool(tmp_path)
    try:
        metrics = Metrics(pool.rt)
        pool.loop = ControlLoop(pool.rt, metrics)
        pool.loop.recovered = pool.loop.reconciler.recover()
        start = pool.now
        run = pool.submit(gpus=2, runtime_estimate_s=100.0)
        pool.step()
        assert pool.status(run) == "running"
        head = pool.submit(gpus=2)
        pool.step(1.0)
        assert pool.row(head).reserved_start_s == pytest.approx(start + 100.0, abs=0.1)
        pool.step(20.0)  # a full pass on time: the same start, no slide
        assert metrics.registry.get_sample_value("gpupool_reservation_slides_total") == 0.0
        pool.step(130.0)  # past the estimate: expected at 200 s now
        assert pool.row(head).reserved_start_s == pytest.approx(start + 200.0, abs=0.1)
        assert metrics.registry.get_sample_value("gpupool_reservation_slides_total") == 1.0
        slid = metrics.registry.get_sample_value("gpupool_reservation_slid_seconds_total")
        assert slid == pytest.approx(100.0, abs=0.1)
    finally:
        pool.close()
