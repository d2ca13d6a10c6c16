"""Issue 35 item 5 through a real `gpupool up` (the pool's defaults: fgd-strand, drf, preemption,
backfill) and the real `gpupool` CLI: a backfill reservation never holds back work that may preempt,
its start comes from estimates of the work it waits on and holds still, and small work that fits
beside the reserved nodes starts at once. Pods are real `sleep` processes on a simulated pool."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.cliproc import gpupool
from server.upproc import UpProcess, until

pytestmark = pytest.mark.slow


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[UpProcess]:
    server = UpProcess(tmp_path / "data", ["--simulate", "2x8xH100"]).start()
    try:
        for tenant in ("a", "b"):
            made = gp(server, "tenant", "create", tenant)
            assert made.returncode == 0, made.stderr
        yield server
        server.end_work()  # its pods are `sleep 600`s
    finally:
        server.stop()


def gp(pool: UpProcess, *args: str) -> Any:
    return gpupool(pool.url, pool.token(), *args, timeout_s=120)


def submit(pool: UpProcess, tenant: str, gpus: str, *args: str) -> str:
    result = gp(pool, "submit", "--tenant", tenant, "--gpus", gpus, *args)
    assert result.returncode == 0, result.stderr
    return str(result.stdout.strip())


def show(pool: UpProcess, workload_id: str) -> dict[str, Any]:
    result = gp(pool, "show", workload_id, "--json")
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def status(pool: UpProcess, workload_id: str) -> str:
    return str(show(pool, workload_id)["status"])


def running(pool: UpProcess, *ids: str, timeout_s: float = 60.0) -> None:
    until(lambda: all(status(pool, w) == "running" for w in ids), timeout_s, f"{', '.join(ids)} running")


def reserved(pool: UpProcess, head: str, timeout_s: float = 30.0) -> float:
    """The head's reserved start once the pool has stored one."""
    until(lambda: show(pool, head)["reserved_start_s"] is not None, timeout_s, f"a reservation for {head}")
    return float(show(pool, head)["reserved_start_s"])


def test_a_critical_job_preempts_at_once_beside_another_queues_reservation(pool: UpProcess) -> None:
    """Tenant a fills the pool with best-effort work (ten-minute limits: estimates of ten minutes).
    Tenant b's critical gang of two 8-GPU pods cannot preempt another tenant's queue: it is reserved for when
    a's work ends. Tenant a's own critical job, walked after it, preempts one of a's best-effort
    jobs and runs within seconds (it waited behind the reservation for good before)."""
    victims = [submit(pool, "a", "8", "--priority-class", "best-effort", "--time-limit", "10m",
                      "--", "sleep", "600") for _ in range(2)]
    running(pool, *victims)
    head = submit(pool, "b", "8", "--replicas", "2", "--priority-class", "critical", "--", "sleep", "600")
    reserved(pool, head)
    critical = submit(pool, "a", "1", "--priority-class", "critical", "--", "sleep", "600")
    running(pool, critical)  # the minute a loaded machine may need: it waited for good before
    stopped = [w for w in victims if status(pool, w) == "pending"]
    assert len(stopped) == 1, [show(pool, w) for w in victims]
    told = gp(pool, "show", stopped[0]).stdout  # its events: preempted by the critical job
    assert "preempted" in told and critical in told, told
    assert status(pool, head) == "pending"


def test_a_reservation_waits_on_estimates_of_its_own_kind_and_holds_still(pool: UpProcess) -> None:
    """Tenant a's short jobs of another shape finish first (history that says nothing of its long
    work). Node one then holds a's 8-GPU job limited to two minutes (its estimate), node two eight
    1-GPU jobs of a with no estimate of their kind. Tenant b's 8-GPU head is reserved for the end
    of the limited job, and that start holds still: before, the 1-GPU jobs were estimated from the
    short ones, so the head was reserved "in a second" and slid at every doubling of that guess."""
    for _ in range(3):
        quick = submit(pool, "a", "0.5", "--", "true")
        until(lambda w=quick: status(pool, w) == "succeeded", 60.0, "a short job done")  # type: ignore[misc]
    limited = submit(pool, "a", "8", "--time-limit", "2m", "--", "sleep", "600")
    running(pool, limited)
    ones = [submit(pool, "a", "1", "--", "sleep", "600") for _ in range(8)]
    running(pool, *ones)
    head = submit(pool, "b", "8", "--", "sleep", "600")
    start = reserved(pool, head)
    expected = float(show(pool, limited)["started_s"]) + 120.0
    assert start == pytest.approx(expected, abs=1.0), (start, expected)
    seen = {round(start, 1)}
    deadline = time.monotonic() + 25.0  # the unestimated jobs' old guesses doubled five times meanwhile
    while time.monotonic() < deadline:
        seen.add(round(float(show(pool, head)["reserved_start_s"]), 1))
        time.sleep(0.5)
    assert seen == {round(start, 1)}, f"the reserved start slid: {sorted(seen)}"
    assert status(pool, head) == "pending"


def test_a_small_job_starts_beside_the_reserved_node_at_once(pool: UpProcess) -> None:
    """Node one holds a's jobs of 7 and 0.5 GPUs (limited to three minutes), node two one GPU of a
    long job: 7.5 GPUs idle. Tenant b's 8-GPU head is reserved on node one. A 0.3-GPU job goes, by
    the packing policy, to node one's half-used GPU, where it would outlast the reservation: it is
    placed again on node two and runs at once (before, it waited as `backfill_blocked`)."""
    filler = submit(pool, "a", "8", "--", "sleep", "600")
    running(pool, filler)
    seven = submit(pool, "a", "7", "--time-limit", "3m", "--", "sleep", "600")
    half = submit(pool, "a", "0.5", "--time-limit", "3m", "--", "sleep", "600")
    running(pool, seven, half)
    node_one = show(pool, seven)["pods"][0]["node"]
    assert show(pool, half)["pods"][0]["node"] == node_one
    cancelled = gp(pool, "cancel", filler)  # cancelled, not finished: no history of its kind
    assert cancelled.returncode == 0, cancelled.stderr
    until(lambda: status(pool, filler) == "cancelled", 60.0, "the filler cancelled")
    one = submit(pool, "a", "1", "--time-limit", "1h", "--", "sleep", "600")
    running(pool, one)
    assert show(pool, one)["pods"][0]["node"] != node_one
    head = submit(pool, "b", "8", "--", "sleep", "600")
    reserved(pool, head)
    small = submit(pool, "a", "0.3", "--time-limit", "1h", "--", "sleep", "600")
    # within the minute a loaded machine may need to place and start it: held back, it would wait
    # for the reservation, at the end of seven's three minutes
    running(pool, small)
    assert show(pool, small)["pods"][0]["node"] != node_one
    assert status(pool, head) == "pending"
