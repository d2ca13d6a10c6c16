"""What the API answers about a workload the live scheduler has handled: the reason's sentence, hint
and finality from the catalogue, retries of the effective max, the time limit, the backfill
reservation, the work lost and kept, and the slices, cpu and memory each pod holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from gpupool.api.reasons import CATALOGUE
from gpupool.server.app import create_app
from gpupool.server.orm import EventRow, PodRow, WorkloadRow
from server.test_live_scheduler import Pool


class Api:
    """The pool's HTTP API (no loop thread: the test steps the loop) as the admin."""

    def __init__(self, pool: Pool) -> None:
        token = pool.rt.settings.admin_token_path.read_text().strip()
        self.http = TestClient(create_app(pool.rt, run_loop=False))
        self.headers = {"Authorization": f"Bearer {token}"}

    def get(self, path: str) -> Any:
        answer = self.http.get(f"/api/v1{path}", headers=self.headers)
        assert answer.status_code == 200, answer.text
        return answer.json()


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    made = Pool(tmp_path)
    yield made
    made.close()


def test_a_preempted_workload_reports_lost_and_kept_work_and_its_class(pool: Pool) -> None:
    low = [pool.submit(priority_class="low", env={"GPUPOOL_FAKE_CHECKPOINT_S": "30"}) for _ in range(2)]
    pool.step()
    pool.step(100.0)  # checkpoints at 30, 60, 90: 10 s lost
    high = pool.submit(priority_class="high", time_limit_s=7200)
    pool.step()
    victim = next(w for w in low if pool.status(w) == "pending")
    api = Api(pool)
    shown = api.get(f"/workloads/{victim}")
    assert shown["spec"]["priority_class"] == "low" and shown["attempt"] == 1
    assert (shown["lost_device_s"], shown["progress_s"], shown["run_s"]) == pytest.approx((10.0, 90.0, 100.0))
    assert (shown["retries"], shown["max_retries"]) == (0, pool.rt.config.failure.max_retries)
    # it waits behind the high-priority work (placed now, for at most 7200 s), and as the head of
    # the queue holds the backfill reservation
    assert pool.row(high).admitted_s == pool.now
    assert shown["reserved_start_s"] == pytest.approx(pool.now + 7200)
    entry = CATALOGUE[shown["reason"]]
    assert (shown["reason_text"], shown["reason_hint"]) == (entry.text, entry.hint)
    assert shown["reason_final"] is False
    events = api.get(f"/workloads/{victim}/events")
    preempted = [e for e in events if e["reason"] == "preempted"]
    assert len(preempted) == 1 and high in preempted[0]["message"]
    assert preempted[0]["reason_text"] == CATALOGUE["preempted"].text
    assert api.get(f"/workloads/{high}")["time_limit_s"] == 7200


def test_each_pod_reports_the_slices_cpu_and_memory_it_holds(pool: Pool) -> None:
    """A 0.25 request without --gpu-memory holds a quarter of the device's memory; cpu and memory
    default to the node's per-device share of a quarter device."""
    workload_id = pool.submit(gpus=0.25)
    pool.step()
    node = pool.provider.nodes()[0]
    device_mib, devices = node.devices[0].memory_mib, len(node.devices)
    (pod,) = Api(pool).get(f"/workloads/{workload_id}")["pods"]
    (held,) = pod["slices"]
    assert (held["compute_milli"], held["memory_mib"]) == (250, device_mib // 4)
    assert pod["cpu_milli"] == node.cpu_milli // devices // 4
    assert pod["memory_mib"] == node.memory_mib // devices // 4
    with pool.rt.store.read() as session:
        row = session.get(PodRow, pod["id"])
        assert row is not None and (row.slices, row.cpu_milli, row.memory_mib) == (
            pod["slices"], pod["cpu_milli"], pod["memory_mib"])


def test_a_retried_workload_reports_retries_of_its_own_max_and_its_backoff(pool: Pool) -> None:
    failing = {"GPUPOOL_FAKE_EXIT_CODE": "3", "GPUPOOL_FAKE_DURATION_S": "1"}
    workload_id = pool.submit(max_retries=2, env=failing)
    pool.step()
    pool.step(1.0)  # exits 3: retry 1 of 2 after a 10 s backoff
    shown = Api(pool).get(f"/workloads/{workload_id}")
    assert (shown["status"], shown["reason"]) == ("pending", "retrying")
    assert (shown["retries"], shown["max_retries"]) == (1, 2)
    assert shown["not_before_s"] == pytest.approx(pool.now + 10.0)
    assert shown["reason_text"] == CATALOGUE["retrying"].text and not shown["reason_final"]


def test_final_reasons_say_so_and_listings_carry_the_same_fields(pool: Pool) -> None:
    workload_id = pool.submit(time_limit_s=60)
    pool.step()
    pool.step(60.0)
    api = Api(pool)
    shown = api.get(f"/workloads/{workload_id}")
    assert (shown["status"], shown["reason"], shown["reason_final"]) == ("failed", "time_limit", True)
    assert shown["reason_hint"] == CATALOGUE["time_limit"].hint
    (listed,) = api.get("/workloads")["items"]
    assert listed == {k: v for k, v in shown.items() if k != "spec"}, "a summary: all but the spec"
    (whole,) = api.get("/workloads?full=true")["items"]
    assert whole == shown


def test_list_pages_leave_out_commands_and_environments_unless_asked(pool: Pool) -> None:
    """A tenant's 1 MiB of command and environment is not copied into every list page."""
    secret = "x" * 20_000
    workload_id = pool.submit(2, command=["train", "--config", secret], env={"BIG": secret},
                              priority_class=None, time_limit_s=3600)
    api = Api(pool)
    page = api.http.get("/api/v1/workloads", headers=api.headers)
    assert page.status_code == 200 and secret not in page.text
    (listed,) = page.json()["items"]
    assert "spec" not in listed
    (whole,) = api.get("/workloads?full=true")["items"]
    spec = whole["spec"]
    assert listed["request"] == {"replicas": 1, "resources": spec["resources"], "time_limit_s": 3600.0,
                                 "priority_class": spec["priority_class"], "topology": None}
    assert listed["request"]["resources"]["gpus"] == 2
    assert whole["spec"]["env"] == {"BIG": secret} and whole["spec"]["command"][-1] == secret
    assert api.get(f"/workloads/{workload_id}")["spec"]["env"] == {"BIG": secret}
    bad = api.http.get("/api/v1/workloads?full=maybe", headers=api.headers)
    assert bad.status_code in (400, 422) and "full" in bad.text


def test_a_reason_code_from_an_older_version_still_reads(pool: Pool) -> None:
    """Codes no enum declares any more (node_gone, requeued) answer as themselves, with no sentence."""
    workload_id = pool.submit()
    with pool.rt.store.write() as session:
        session.execute(update(WorkloadRow).where(WorkloadRow.id == workload_id).values(reason="node_gone"))
        session.add(EventRow(workload_id=workload_id, to_status="pending", reason="requeued", message="",
                             at_s=pool.now))
    api = Api(pool)
    shown = api.get(f"/workloads/{workload_id}")
    assert (shown["reason"], shown["reason_text"], shown["reason_hint"]) == ("node_gone", "", "")
    assert api.get(f"/workloads/{workload_id}/events")[-1]["reason_text"] == ""
