"""`gpupool show` on workloads the live scheduler handled (a control loop stepped on a virtual clock,
answered through the real API): the reason's sentence and hint, the scheduling record (class,
attempt, retries, time limit, reservation, lost and kept work, array) and the slices each pod holds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gpupool.api.reasons import CATALOGUE
from gpupool.cli import show
from gpupool.cli.main import app
from gpupool.client import Client
from gpupool.server.app import create_app
from gpupool.server.services import workloads
from server.test_live_scheduler import ADMIN, Pool

runner = CliRunner()


@pytest.fixture
def pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pool]:
    """A pool whose API the CLI reaches in-process; `show` reads the pool's clock."""
    made = Pool(tmp_path)
    token = made.rt.settings.admin_token_path.read_text().strip()
    http = TestClient(create_app(made.rt, run_loop=False))
    monkeypatch.setattr(show, "client", lambda: Client("http://testserver", token, transport=http._transport))
    monkeypatch.setattr(show, "now_s", lambda: made.now)
    yield made
    made.close()


def gp(*args: str) -> str:
    result = runner.invoke(app, ["show", *args], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return result.output


def line(output: str, start: str) -> str:
    return next(x for x in output.splitlines() if x.startswith(start))


def _preempt(pool: Pool) -> tuple[str, str]:
    """Two low-class workloads checkpointing every 30 s run 100 s; a high-class one with a 2 h
    limit preempts one of them, which then waits as the head of the queue (its reservation)."""
    low = [pool.submit(priority_class="low", env={"GPUPOOL_FAKE_CHECKPOINT_S": "30"}) for _ in range(2)]
    pool.step()
    pool.step(100.0)
    high = pool.submit(priority_class="high", time_limit_s=7800)
    pool.step()
    return next(w for w in low if pool.status(w) == "pending"), high


def test_show_prints_the_reason_sentence_hint_and_the_scheduling_record(pool: Pool) -> None:
    victim, high = _preempt(pool)
    out = gp(victim)
    reason = pool.row(victim).reason
    assert line(out, "reason: ") == f"reason: {reason}: {pool.row(victim).message}"
    assert f"  {CATALOGUE[reason].text}" in out.splitlines()
    assert f"  hint: {CATALOGUE[reason].hint}" in out.splitlines()
    pool_max = pool.rt.config.failure.max_retries  # the spec names none
    assert line(out, "scheduling: ") == (
        f"scheduling: class low, priority 0, attempt 1, retries 0 of {pool_max}, time limit none")
    assert line(out, "reserved start: ").endswith("(in 2h 10m; backfill holds room for it)")
    assert line(out, "work: ") == ("work: lost 0.00 GPU-hours (10 GPU-seconds) to preemptions and "
                                   "evictions; kept 1m 30s from checkpoints; ran 1m 40s in earlier attempts")
    assert "Preempted by higher-priority workload" in out  # the event, in the events table
    assert "time limit 2h 10m" in line(gp(high), "scheduling: ")


def test_show_json_has_every_field_the_scheduler_records(pool: Pool) -> None:
    victim, _ = _preempt(pool)
    shown: dict[str, Any] = json.loads(gp(victim, "--json"))
    expected = workloads.get(pool.rt, ADMIN, victim).model_dump(mode="json")
    assert shown == expected
    for field in ("reason_text", "reason_hint", "reason_final", "retries", "max_retries", "time_limit_s",
                  "reserved_start_s", "progress_s", "lost_device_s", "array_id", "array_index"):
        assert field in shown
    assert (shown["lost_device_s"], shown["progress_s"]) == (10.0, 90.0)
    assert shown["reserved_start_s"] == pool.now + 7800
    assert shown["pods"][0]["cpu_milli"] > 0 and shown["pods"][0]["slices"][0]["memory_mib"] > 0


def test_show_lists_the_slices_cpu_and_memory_each_pod_holds(pool: Pool) -> None:
    workload_id = pool.submit(gpus=0.25)
    pool.step()
    node = pool.provider.nodes()[0]
    quarter_mib = node.devices[0].memory_mib // 4
    out = gp(workload_id)
    (pod,) = workloads.get(pool.rt, ADMIN, workload_id).pods
    cells = [cell.strip() for cell in line(out, f"│ {pod.id} ").split("│")]
    assert cells[4:7] == [f"dev{pod.slices[0].device_index}:0.25/{quarter_mib // 1024}GiB",
                          f"{pod.cpu_milli / 1000:g}", f"{pod.memory_mib // 1024}GiB"], cells


def test_show_prints_retries_of_the_max_and_the_backoff_then_the_final_reason(pool: Pool) -> None:
    failing = {"GPUPOOL_FAKE_EXIT_CODE": "3", "GPUPOOL_FAKE_DURATION_S": "1"}
    workload_id = pool.submit(max_retries=1, env=failing)
    pool.step()
    pool.step(1.0)
    out = gp(workload_id)
    assert "retries 1 of 1" in line(out, "scheduling: ")
    assert line(out, "retry backoff: ").endswith("(in 10s)")
    assert f"  {CATALOGUE['retrying'].text}" in out.splitlines()
    pool.step(10.0)
    pool.step(1.0)
    out = gp(workload_id)
    assert line(out, "reason: ") == "reason: pod_failed: Pod r0 exited with code 3 (after 1 retries)."
    assert f"  hint: {CATALOGUE['pod_failed'].hint}" in out.splitlines()
    assert "retry backoff" not in out


def test_show_names_the_array_and_its_index(pool: Pool) -> None:
    array_id = workloads.submit(pool.rt, ADMIN, workloads.WorkloadSpec.model_validate(
        {"command": ["train"], "array": "0-3%2"})).id
    task = f"{array_id}_2"
    assert line(gp(task), "array: ") == f"array: {array_id} index 2 (at most 2 at once)"
