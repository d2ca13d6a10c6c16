"""The waits of passed-over workloads, reused from cycle to cycle while their verdict stays the same
(`pending.PassedWaits`), are the waits a cycle builds afresh: the same records, in the same order."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from pathlib import Path

import pytest
import test_admission_properties as props
from bench_loop import bench_loop
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import cluster, workload
from gpupool.config import load_config
from gpupool.core.model import Workload
from gpupool.core.scheduling import cycle
from gpupool.core.scheduling.cycle import CycleResult, Policies, Wait, cycle_on
from gpupool.core.scheduling.pending import MAX_VERDICTS, PassedWaits
from gpupool.core.scheduling.view import ClusterView


def _bench_loop(policies: Policies, cycles: int) -> list[CycleResult]:
    """40 nodes, 400 waiting."""
    return [result for result, _ in bench_loop(policies, cycles, nodes=40, pending=400, seed=3, churn_seed=5,
                                               churn=3)]


def _plain(run):  # type: ignore[no-untyped-def]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle._Cycle, "keep_waits", False)
        return run()


@pytest.mark.parametrize("config", ["default", "bench/configs/full.yaml"])
def test_the_bench_loop_decides_the_same_with_waits_reused(config: str) -> None:
    """Every decision of every cycle, waits included, equal and in the same order (tuples compare by
    their fields: the kind is compared apart), with waits the record of the cycle before (under
    the full configuration's quotas most verdicts name usage that changes from cycle to cycle)."""
    root = Path(__file__).resolve().parents[3]
    policies = load_config(None if config == "default" else root / config).policies()
    fast = _bench_loop(policies, cycles=12)
    plain = _plain(lambda: _bench_loop(policies, cycles=12))
    for a, b in zip(fast, plain, strict=True):
        assert a.decisions == b.decisions
        assert list(map(type, a.decisions)) == list(map(type, b.decisions))
    reused = fresh = 0
    for before, after in itertools.pairwise(fast):
        last = {d.workload_id: d for d in before.decisions if type(d) is Wait}
        for d in after.decisions:
            if type(d) is Wait and d.workload_id in last:
                if d is last[d.workload_id]:
                    reused += 1
                else:
                    fresh += 1
    assert reused > 0  # built afresh: none
    if config == "default":  # one queue: most waits are the record of the cycle before
        assert reused > 4 * fresh


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), props.narrow_job), min_size=2, max_size=40),
    st.sampled_from(["priority-fifo", "drf"]),
    st.booleans(),
    st.booleans(),
)
def test_random_runs_decide_the_same_with_waits_reused(
    sequence: list, ordering: str, preemption: bool, backfill: bool
) -> None:
    """Random arrivals and ends on a small pool with quotas: keys that fail, then fit again after an
    end or a preemption, and queues whose quota message changes, so passed-over verdicts change
    between cycles; every cycle's decisions equal those built afresh, in order."""
    policies = replace(props.BASE, ordering=ordering, preemption=preemption, backfill=backfill)
    fast = _drive(sequence, policies)
    plain = _plain(lambda: _drive(sequence, policies))
    assert [r.decisions for r in fast] == [r.decisions for r in plain]
    assert [list(map(type, r.decisions)) for r in fast] == [list(map(type, r.decisions)) for r in plain]


def _drive(sequence: list, policies: Policies) -> list[CycleResult]:
    """`props._drive` with each step's arrivals in threes (many workloads share a key and are
    passed over), on one view kept across the cycles."""
    view = ClusterView.empty(cluster(2, devices=4), policies.quota, policies.priority_classes)
    rng = random.Random(11)
    pending: dict[str, Workload] = {}
    running: dict[str, Workload] = {}
    results = []
    for step, (finish_one, spec) in enumerate(sequence):
        now = float(step * 5)
        if finish_one and view.running:
            view.remove(sorted(view.running)[rng.randrange(len(view.running))])
        for k in range(3):
            w = props._workload(3 * step + k, spec, now)
            pending[w.id] = w
        running.update((wid, r.workload) for wid, r in view.running.items())
        result = cycle_on(view, list(pending.values()), policies, now, rng)
        for stop in result.preempted:
            pending[stop.workload_id] = running[stop.workload_id]
        for admission in result.admitted:
            pending.pop(admission.workload_id)
        for rejection in result.rejected:
            if rejection.final:
                pending.pop(rejection.workload_id)
        results.append(result)
    return results


def test_a_changed_verdict_gets_a_new_record() -> None:
    """The records are kept per key by the interned verdict they were built from: a verdict equal to
    the last one gives the same records back, another one new records for every workload of that
    key, those passed over now and those that were not (and is kept from then on)."""
    waits = PassedWaits()
    quota = (cycle.Reason.QUOTA_EXCEEDED, "Queue 'a' is over its quota.")
    room = (cycle.Reason.NO_NODE_FITS, "No node has room.")
    kid_of = {"w1": 0, "w2": 0, "w3": 1}

    def records(wids: list[str], verdicts: dict[int, tuple[cycle.Reason, str]]) -> list[Wait]:
        interned = {kid: waits.intern(v) for kid, v in verdicts.items()}
        return list(waits.records_by_key(wids, kid_of, interned, cycle._wait_of))

    a = records(["w1", "w2", "w3"], {0: quota, 1: room})
    assert a == [Wait("w1", *quota), Wait("w2", *quota), Wait("w3", *room)]
    equal = (quota[0], quota[1][:5] + quota[1][5:])  # another object, equal
    assert equal is not quota
    b = records(["w2", "w1", "w3"], {0: equal, 1: room})  # equal verdicts: the same records
    assert b[0] is a[1] and b[1] is a[0] and b[2] is a[2]
    c = records(["w1"], {0: room, 1: room})  # key 0 changed while only w1 is passed over
    assert c == [Wait("w1", *room)] and c[0] is not a[0]
    d = records(["w2", "w3"], {0: room, 1: room})  # w2 was not passed over then: rebuilt all the same
    assert d == [Wait("w2", *room), Wait("w3", *room)]
    assert d[1] is a[2]
    e = records(["w1", "w2"], {0: quota})  # back to the first verdict: new records again
    assert e == [Wait("w1", *quota), Wait("w2", *quota)]
    waits.forget([workload(wid="w2")])  # departed: rebuilt if it comes back
    assert "w2" not in waits.records
    assert records(["w2"], {0: quota}) == [Wait("w2", *quota)]


def test_the_ids_kept_per_key_stay_bounded() -> None:
    """Departed ids stay listed under their key until it changes; past a bound every record is
    built afresh, so a long-lived view does not collect them without end."""
    waits = PassedWaits()
    verdict = {0: waits.intern((cycle.Reason.NO_NODE_FITS, "No node has room."))}
    for step in range(3 * MAX_VERDICTS):
        wid = f"w{step}"
        found = list(waits.records_by_key([wid], {wid: 0}, verdict, cycle._wait_of))
        assert found == [Wait(wid, *verdict[0])]
        waits.forget([workload(wid=wid)])
    assert waits.listed <= MAX_VERDICTS + 1
    assert sum(map(len, waits.members.values())) == waits.listed
