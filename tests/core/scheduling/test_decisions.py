"""One ordered list of decisions per cycle (`CycleResult.decisions`), applied through one exhaustive
match by each applier: the kept view (`ViewKeeper`), the replay (`Replay._apply`) and the server
(tests/server/test_decision_applier.py)."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, get_args

import pytest

from factories import cluster, pod, workload
from gpupool.core.model import ClusterSnapshot, Reason
from gpupool.core.scheduling.congestion import CongestionSample, MigrateRule
from gpupool.core.scheduling.cycle import (
    Admit,
    CycleResult,
    Decision,
    EventKind,
    Policies,
    Refuse,
    Reserve,
    Stop,
    Wait,
    cycle_on,
)
from gpupool.core.scheduling.keeper import ViewKeeper
from gpupool.core.scheduling.view import ClusterView
from gpupool.errors import InvalidInput
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import Replay, ReplayConfig

ROOT = Path(__file__).resolve().parents[3]
FF = Policies(placement="first-fit", ordering="priority-fifo", preemption=True)


@dataclass(frozen=True, slots=True)
class Bogus:
    """A kind of decision no applier knows (as one added to the core and forgotten elsewhere)."""

    workload_id: str


def test_the_decision_kinds_are_the_five_the_appliers_match() -> None:
    assert set(get_args(Decision)) == {Admit, Stop, Wait, Refuse, Reserve}


def test_a_preemption_is_one_stop_record_before_its_preemptors_admission() -> None:
    view = ClusterView.empty(cluster(1, devices=1))
    low = replace(workload(pod(1), wid="low"), checkpoint_interval_s=30.0)
    cycle_on(view, [low], FF, 0.0, random.Random(0))
    urgent = replace(workload(pod(1), wid="urgent"), priority_class="critical")
    waiting = workload(pod(1), wid="later", submit_s=5.0)
    result = cycle_on(view, [urgent, waiting], FF, 100.0, random.Random(0))
    kinds = [(type(d).__name__, d.workload_id) for d in result.decisions]
    assert kinds == [("Stop", "low"), ("Admit", "urgent"), ("Wait", "later")]
    stop = result.decisions[0]
    assert isinstance(stop, Stop)
    # the stop and its requeue are one record: who, why, grace, where it resumes, what it lost
    assert (stop.kind, stop.reason, stop.preemptor_id, stop.grace) == (
        EventKind.PREEMPT, Reason.PREEMPTED, "urgent", True)
    assert (stop.resume_progress_s, stop.lost_work_s, stop.lost_device_s) == (90.0, 10.0, 10.0)
    assert result.preempted == result.requeued == (stop,)


def test_an_eviction_stops_without_grace_and_a_refusal_is_its_own_kind() -> None:
    nodes = cluster(2, devices=1)
    view = ClusterView.empty(nodes)
    cycle_on(view, [workload(pod(1), wid="a")], FF, 0.0, random.Random(0))
    view.mark_unhealthy(nodes[0].name)
    never = workload(pod(4), wid="huge")
    result = cycle_on(view, [never], FF, 50.0, random.Random(0))
    first, last = result.decisions
    assert isinstance(first, Stop) and first.kind is EventKind.EVICT and not first.grace
    assert isinstance(last, Refuse) and last.final and last.reason is Reason.NEVER_FITS
    assert not isinstance(last, Wait)


def test_the_reservation_comes_last() -> None:
    view = ClusterView.empty(cluster(1, devices=2))
    backfill = replace(FF, preemption=False, backfill=True)
    cycle_on(view, [replace(workload(pod(1), wid="run"), runtime_estimate_s=100.0)], backfill, 0.0,
             random.Random(0))
    head = workload(pod(2), wid="head", submit_s=1.0)
    small = replace(workload(pod(1), wid="small", submit_s=2.0), runtime_estimate_s=10.0)
    result = cycle_on(view, [head, small], backfill, 10.0, random.Random(0))
    assert isinstance(result.decisions[-1], Reserve) and result.reservation == Reserve("head", 100.0)
    assert [type(d) for d in result.decisions] == [Wait, Admit, Reserve]


def test_a_congested_gang_is_stopped_by_the_cycle_with_kind_migrate() -> None:
    view = ClusterView.empty(cluster(4, devices=1))
    gang = replace(workload(pod(1, name="r0"), pod(1, name="r1"), wid="g"), checkpoint_interval_s=20.0)
    cycle_on(view, [gang, workload(pod(1), wid="one")], FF, 0.0, random.Random(0))
    migrate = replace(FF, migrate=MigrateRule(threshold=0.8, hold_s=60.0))
    view.congestion_sample = CongestionSample(10.0, {"g": 0.95, "one": 0.1})
    assert not cycle_on(view, [], migrate, 10.0, random.Random(0)).decisions  # hot, not for long enough
    assert view.congested_since == {"g": 10.0}
    view.congestion_sample = CongestionSample(70.0, {"g": 0.95})
    result = cycle_on(view, [], migrate, 70.0, random.Random(0))
    (stop,) = result.decisions
    assert isinstance(stop, Stop) and stop.kind is EventKind.MIGRATE and stop.grace
    assert stop.reason is Reason.CONGESTION_MOVED and stop.resume_progress_s == 60.0
    assert stop.lost_work_s == 10.0 and stop.lost_device_s == 20.0
    assert "g" not in view.running and view.congested_since == {}
    # without the rule the sample is dropped and nobody moves
    view2 = ClusterView.empty(cluster(2, devices=1))
    cycle_on(view2, [gang], FF, 0.0, random.Random(0))
    view2.congestion_sample = CongestionSample(0.0, {"g": 2.0})
    assert not cycle_on(view2, [], FF, 500.0, random.Random(0)).decisions
    assert view2.congestion_sample is None and "g" in view2.running


def test_a_migrated_gang_gives_its_devices_back_and_is_placed_again_at_once() -> None:
    """The stop frees what the gang held (devices, quota) in the view, as a preemption does: the
    gang itself, requeued, fits again in the next cycle of the same instant (a view that kept its
    devices taken let it wait for work to end, and its free capacity drifted from the store)."""
    view = ClusterView.empty(cluster(2, devices=1))
    gang = replace(workload(pod(1, name="r0"), pod(1, name="r1"), wid="g"), checkpoint_interval_s=20.0)
    cycle_on(view, [gang], FF, 0.0, random.Random(0))
    assert int(view.state.dev_milli_free.sum()) == 0
    migrate = replace(FF, migrate=MigrateRule(threshold=0.8, hold_s=0.0))
    view.congestion_sample = CongestionSample(30.0, {"g": 0.95})
    (stop,) = cycle_on(view, [], migrate, 30.0, random.Random(0)).decisions
    assert isinstance(stop, Stop) and stop.kind is EventKind.MIGRATE
    assert int(view.state.dev_milli_free.sum()) == 2000 and "g" not in view.running
    view.state.check_invariants()
    view.quota.check_invariants()
    again = cycle_on(view, [gang], migrate, 30.0, random.Random(0))
    assert [type(d) for d in again.decisions] == [Admit] and "g" in view.running


def test_a_gang_is_moved_off_congestion_at_most_max_moves_each_times() -> None:
    """Where every placement crosses the congested link, a gang moved at every sample would never
    finish: after `max_moves_each` moves it stays where it runs, and the count is what the view's
    caller keeps (WorkloadInfo.congestion_moves), so a rebuilt view keeps the bound."""
    view = ClusterView.empty(cluster(2, devices=1))
    gang = replace(workload(pod(1, name="r0"), pod(1, name="r1"), wid="g"), checkpoint_interval_s=20.0)
    migrate = replace(FF, migrate=MigrateRule(threshold=0.8, hold_s=0.0, max_moves_each=2))
    cycle_on(view, [gang], migrate, 0.0, random.Random(0))
    moved = 0
    for at in range(1, 6):
        view.congestion_sample = CongestionSample(30.0 * at, {"g": 0.95})
        decisions = cycle_on(view, [gang] if "g" not in view.running else [], migrate, 30.0 * at,
                             random.Random(0)).decisions
        moved += sum(1 for d in decisions if isinstance(d, Stop) and d.kind is EventKind.MIGRATE)
        if "g" not in view.running:
            cycle_on(view, [gang], migrate, 30.0 * at, random.Random(0))
        assert "g" in view.running
    assert moved == 2 and view.info["g"].congestion_moves == 2
    with pytest.raises(InvalidInput, match="bounded by at least 1"):
        MigrateRule(max_moves_each=0)


def test_the_kept_view_refuses_a_decision_it_cannot_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpupool.core.scheduling.keeper as keeper_module

    keeper = ViewKeeper()
    snapshot = ClusterSnapshot(nodes=tuple(cluster(1, devices=1)), allocations=())
    monkeypatch.setattr(keeper_module, "cycle_on", lambda *a: CycleResult((Bogus("w"),)))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Bogus"):
        keeper.cycle(snapshot, [], FF, 0.0, random.Random(0))


def test_the_replay_refuses_a_decision_it_cannot_apply() -> None:
    w = workload(pod(1), wid="j")
    run = Replay(ReplayConfig(tuple(cluster(1, devices=1)), (TraceJob(w, 0.0, 10.0),), FF))
    with pytest.raises(TypeError, match="No applier case for the decision Bogus"):
        run._apply(CycleResult((Bogus("j"),)), 0.0)  # type: ignore[arg-type]


def test_the_replay_applies_every_kind() -> None:
    seen: list[Any] = []

    class Seen(Replay):
        def _apply(self, result: CycleResult, now_s: float) -> None:
            seen.extend(type(d) for d in result.decisions)
            super()._apply(result, now_s)

    nodes = tuple(cluster(2, devices=1))
    jobs = (
        TraceJob(replace(workload(pod(1), wid="low"), runtime_estimate_s=100.0), 0.0, 100.0),
        TraceJob(replace(workload(pod(1), wid="low2", submit_s=1.0), runtime_estimate_s=100.0), 1.0, 100.0),
        TraceJob(replace(workload(pod(1), wid="urgent", submit_s=5.0), priority_class="critical"), 5.0, 10.0),
        TraceJob(workload(pod(4), wid="huge", submit_s=6.0), 6.0, 10.0),
        TraceJob(workload(pod(1, name="r0"), pod(1, name="r1"), wid="pair", submit_s=7.0), 7.0, 10.0),
    )
    result = Seen(ReplayConfig(nodes, jobs, replace(FF, backfill=False), check_invariants=True)).run()
    assert {Stop, Admit, Wait, Refuse} <= set(seen)
    assert result["unfinished"] == 0 and result["rejected"] == 1 and result["preemptions"] == 1


@pytest.mark.skipif(shutil.which("mypy") is None and not (Path(sys.executable).parent / "mypy").exists(),
                    reason="mypy is not installed")
def test_a_match_that_forgets_a_kind_fails_the_type_check(tmp_path: Path) -> None:
    snippet = tmp_path / "applier.py"
    snippet.write_text(
        "from gpupool.core.scheduling.cycle import Admit, Decision, Refuse, Stop, Wait, unhandled\n\n\n"
        "def apply(decision: Decision) -> None:\n"
        "    match decision:\n"
        "        case Admit() | Stop() | Wait() | Refuse():\n"
        "            pass\n"
        "        case _:\n"
        "            unhandled(decision)\n")
    mypy = [sys.executable, "-m", "mypy", "--no-error-summary", str(snippet)]
    found = subprocess.run(mypy, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert found.returncode == 1, found.stdout + found.stderr
    assert 'incompatible type "Reserve"; expected "Never"' in found.stdout
    snippet.write_text(snippet.read_text().replace("Refuse()", "Refuse() | Reserve()").replace(
        "Refuse, Stop", "Refuse, Reserve, Stop"))
    assert subprocess.run(mypy, cwd=ROOT, capture_output=True, text=True, timeout=600).returncode == 0


def test_a_discarded_cycle_is_decided_again_as_if_it_had_not_run() -> None:
    """`ViewKeeper.discard`: none of an undoable cycle's decisions is carried out, so the next cycle
    on the same snapshot decides the same again: the congestion sample it judged, and the stop it
    decided, are not lost with it."""
    nodes = tuple(cluster(4, devices=1))
    gang = replace(workload(pod(1, name="r0"), pod(1, name="r1"), wid="g"), checkpoint_interval_s=20.0)
    keeper = ViewKeeper()
    empty = ClusterSnapshot(nodes=nodes, allocations=())
    first = keeper.cycle(empty, [gang], FF, 0.0, random.Random(0))
    (admit,) = first.admitted
    from gpupool.core.model import Allocation

    running = ClusterSnapshot(nodes=nodes, allocations=(Allocation(gang, admit.placements, 0.0),))
    migrate = replace(FF, migrate=MigrateRule(threshold=0.8, hold_s=0.0))
    assert keeper.view is not None
    keeper.view.congestion_sample = CongestionSample(30.0, {"g": 0.9})
    with pytest.raises(ValueError, match="undoable"):
        keeper.discard()
    undone = keeper.cycle(running, [], migrate, 30.0, random.Random(0), undoable=True)
    assert [(type(d), d.workload_id) for d in undone.decisions] == [(Stop, "g")]
    keeper.discard()
    again = keeper.cycle(running, [], migrate, 30.0, random.Random(0))
    assert again.decisions == undone.decisions
    assert "g" not in keeper.view.running


def test_work_passed_over_is_refused_or_waits_as_if_each_were_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpupool.core.scheduling.cycle as cycle_module

    def decide() -> list[tuple[str, str, Reason]]:
        view = ClusterView.empty(cluster(1, devices=1))
        cycle_on(view, [workload(pod(1), wid="busy")], FF, 0.0, random.Random(0))
        # the small ones first: once the first huge one is refused, the other two are passed over
        pending = [workload(pod(1), wid=f"small{i}", submit_s=1.0 + i) for i in range(3)]
        pending += [workload(pod(4), wid=f"huge{i}", submit_s=5.0 + i) for i in range(3)]
        result = cycle_on(view, pending, replace(FF, preemption=False), 10.0, random.Random(0))
        return sorted((type(d).__name__, d.workload_id, d.reason) for d in result.rejected)

    fast = decide()
    monkeypatch.setattr(cycle_module._Cycle, "pass_over", False)
    assert fast == decide()
    assert [k for k, w, _ in fast if w.startswith("huge")] == ["Refuse"] * 3
    assert [k for k, w, _ in fast if w.startswith("small")] == ["Wait"] * 3
