"""The replay protocol on tiny traces: metrics, determinism, failures, overcommit, the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from factories import cluster, pod
from gpupool.cli.sim import app
from gpupool.core.model import Workload
from gpupool.core.overcommit import ModelRatio, OvercommitConfig
from gpupool.core.scheduling.cycle import Policies
from gpupool.sim.engine import EventLoop
from gpupool.sim.jobs import TraceJob, philly_jobs
from gpupool.sim.replay import NodeFailure, ReplayConfig, replay

FIXTURES = Path(__file__).parents[1] / "fixtures" / "replay"
FF = Policies(placement="first-fit", ordering="priority-fifo")
KEYS = {
    "gpu_alloc_pct_mean",
    "gpu_alloc_pct_timeline",
    "queue_delay_s",
    "jct_s",
    "makespan_s",
    "preemptions",
    "lost_gpu_hours",
    "per_tenant",
    "wall_s",
}


def _job(wid: str, gpus: float, submit: float, duration: float, **kw: object) -> TraceJob:
    w = Workload(id=wid, pods=(pod(gpus, name="p"),), submit_time_s=submit, **kw)  # type: ignore[arg-type]
    return TraceJob(w, submit, duration)


def test_event_loop_batches_and_cancels() -> None:
    loop = EventLoop()
    seen: list[tuple[float, list[str]]] = []
    loop.schedule(5.0, "b")
    token = loop.schedule(5.0, "x")
    loop.schedule(1.0, "a")
    loop.cancel(token)
    loop.run(lambda now, batch: seen.append((now, [e.kind for e in batch])))
    assert seen == [(1.0, ["a"]), (5.0, ["b"])]


def test_queueing_delay_and_jct_on_a_tiny_pool() -> None:
    jobs = (_job("a", 1, 0, 100), _job("b", 1, 10, 50))
    result = replay(ReplayConfig(tuple(cluster(1, devices=1)), jobs, FF, check_invariants=True))
    assert set(result) >= KEYS
    assert result["queue_delay_s"]["mean"] == 45.0  # b waits from 10 to 100
    assert result["jct_s"]["mean"] == pytest.approx((100 + 140) / 2)
    assert result["makespan_s"] == 150.0
    assert result["gpu_alloc_pct_mean"] == pytest.approx(100.0)


def test_idle_while_waiting_counts_free_gpus_up_to_what_waits() -> None:
    # 3 nodes x 4 GPUs. a, b, c leave 2 + 1 + 1 GPUs free; d (3 GPUs in one pod) cannot fit the
    # 4 free ones and waits from 10 to 100: 3 GPUs idle while waiting (what waits, not all 4 free).
    # e, the last arrival at 200, starts at once: the window is 0-200.
    jobs = (_job("a", 2, 0, 100), _job("b", 3, 0, 100), _job("c", 3, 0, 100), _job("d", 3, 10, 50),
            _job("e", 1, 200, 10))
    result = replay(ReplayConfig(tuple(cluster(3, devices=4)), jobs, FF, check_invariants=True))
    assert result["queue_delay_s"]["mean"] == pytest.approx(90 / 5)
    idle = result["idle_while_waiting"]
    assert idle["gpu_hours"] == pytest.approx(3 * 90 / 3600)
    assert idle["pct"] == pytest.approx(100 * 3 * 90 / (12 * 200))
    assert idle["waiting_share"] == pytest.approx(90 / 200)


def test_idle_while_waiting_is_capped_by_the_free_gpus() -> None:
    # One node of 4 GPUs: a holds 2, b wants all 4 and waits 10-100 beside 2 free GPUs.
    jobs = (_job("a", 2, 0, 100), _job("b", 4, 10, 50), _job("c", 1, 200, 10))
    idle = replay(ReplayConfig(tuple(cluster(1, devices=4)), jobs, FF))["idle_while_waiting"]
    assert idle["gpu_hours"] == pytest.approx(2 * 90 / 3600)
    assert idle["pct"] == pytest.approx(100 * 2 * 90 / (4 * 200))


def test_philly_replay_is_deterministic_and_fair_shares_sum_to_one() -> None:
    jobs = tuple(philly_jobs(FIXTURES / "philly_tiny.csv", 8, seed=3))
    config = ReplayConfig(
        tuple(cluster(2, devices=8)),
        jobs,
        replace(FF, preemption=True, backfill=True),
        seed=3,
        check_invariants=True,
    )
    first, second = replay(config), replay(config)
    first.pop("wall_s"), second.pop("wall_s")
    first.pop("cycle_ms_mean"), second.pop("cycle_ms_mean")
    assert first == second
    assert first["finished"] == 6
    shares = first["per_tenant"]
    assert sum(t["share"] for t in shares.values()) == pytest.approx(1.0)
    assert sum(t["fair_share"] for t in shares.values()) == pytest.approx(1.0)


def test_node_failure_evicts_requeues_and_accounts_lost_work() -> None:
    nodes = tuple(cluster(2, devices=1))
    jobs = (_job("a", 1, 0, 100, checkpoint_interval_s=30.0),)
    failure = NodeFailure(at_s=50.0, node=nodes[0].name, repair_after_s=1000.0)
    result = replay(ReplayConfig(nodes, jobs, FF, failures=(failure,), check_invariants=True))
    assert result["evictions"] == 1 and result["finished"] == 1
    assert result["lost_gpu_hours"] == pytest.approx(20.0 / 3600)  # 50 s done, 30 s kept
    assert result["jct_s"]["mean"] == pytest.approx(50 + 70)  # resumes at once on the other node


def test_preemption_in_replay_resumes_from_checkpoint() -> None:
    jobs = (
        _job("low", 1, 0, 100, priority_class="best-effort", checkpoint_interval_s=40.0),
        _job("high", 1, 50, 10, priority_class="high"),
    )
    result = replay(ReplayConfig(tuple(cluster(1, devices=1)), jobs, replace(FF, preemption=True)))
    assert result["preemptions"] == 1
    assert result["lost_gpu_hours"] == pytest.approx(10.0 / 3600)
    assert result["makespan_s"] == pytest.approx(60 + 60)  # low resumes at 60 from 40 s of progress


def test_overcommit_admits_more_and_runs_slower() -> None:
    jobs = tuple(_job(f"j{i}", 0.5, 0, 100) for i in range(4))
    nodes = tuple(cluster(1, devices=1))
    plain = replay(ReplayConfig(nodes, jobs, FF))
    # Memory oversubscribed like compute: each slice's default memory (half the device) halves too.
    both = OvercommitConfig({"*": ModelRatio(2.0, 2.0)})
    over = replay(ReplayConfig(nodes, jobs, replace(FF, overcommit=both)))
    assert plain["makespan_s"] == 200.0  # two at a time, full speed
    assert over["queue_delay_s"]["mean"] == 0.0  # all four at once ...
    # ... but each may use its default share (half the device's memory): twice the memory there is,
    # so beside half speed (2000/1000 milli asked) they pay the spill penalty
    assert over["makespan_s"] > 200.0
    # with a small explicit memory each, only compute is shared: exactly half speed
    small = tuple(TraceJob(replace(j.workload, pods=(replace(j.workload.pods[0], device_memory_mib=1024),)),
                           j.submit_s, j.duration_s) for j in jobs)
    shared = replay(ReplayConfig(nodes, small, replace(FF, overcommit=both)))
    assert shared["queue_delay_s"]["mean"] == 0.0 and shared["makespan_s"] == pytest.approx(200.0)


def test_cli_replay_writes_json_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    args = [
        "replay",
        "--cluster",
        "2x8xV100M32",
        "--trace",
        f"philly:{FIXTURES / 'philly_tiny.csv'}",
        "--window",
        "2017-10-01:2017-10-03",
        "--ordering",
        "drf",
        "--policy",
        "first-fit",
        "--preemption",
        "--backfill",
        "--seed",
        "1",
        "--json",
        str(out),
        "--plot",
        str(png),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data) >= KEYS and data["finished"] == 6
    assert png.stat().st_size > 1000


def test_cli_replay_openb_exclusive(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = [
        "replay",
        "--nodes",
        str(FIXTURES / "openb_tiny_nodes.csv"),
        "--trace",
        f"openb:{FIXTURES / 'openb_tiny_pods.csv'}",
        "--ordering",
        "fifo",
        "--policy",
        "first-fit",
        "--no-preemption",
        "--no-backfill",
        "--exclusive",
        "--seed",
        "0",
        "--json",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["finished"] == 5


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--trace", "slurm:x.csv", "--cluster", "1x8xV100M32"], "Unknown trace format"),
        (["--trace", "philly:nope.csv", "--cluster", "1x8xV100M32"], "does not exist"),
        (["--trace", "philly:x.csv"], "exactly one of --nodes"),
        (["--trace", "philly:x.csv", "--cluster", "1x8xV100M32", "--preemption", "maybe"], "extra argument"),
    ],
)
def test_cli_bad_usage_exits_2_with_one_sentence(tmp_path: Path, extra: list[str], message: str) -> None:
    args = [
        "replay",
        *extra,
        "--ordering",
        "fifo",
        "--policy",
        "first-fit",
        "--json",
        str(tmp_path / "o.json"),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_cli_replay_reads_the_pool_configuration(tmp_path: Path) -> None:
    """`--config` gives the same decisions as the equivalent flags; flags given on the command line
    win over the file."""
    common = ["replay", "--cluster", "2x8xV100M32", "--trace", f"philly:{FIXTURES / 'philly_tiny.csv'}",
              "--window", "2017-10-01:2017-10-03", "--seed", "1"]
    config = tmp_path / "pool.yaml"
    config.write_text("scheduling:\n  placement: first-fit\n  ordering: drf\n  preemption: true\n"
                      "  backfill: true\n")
    runs = {}
    flags = ["--ordering", "drf", "--policy", "first-fit", "--preemption", "--backfill"]
    for name, extra in (("flags", flags),
                        ("file", ["--config", str(config)]),
                        ("override", ["--config", str(config), "--ordering", "fifo", "--no-backfill"])):
        out = tmp_path / f"{name}.json"
        result = CliRunner().invoke(app, [*common, *extra, "--json", str(out)])
        assert result.exit_code == 0, result.output
        runs[name] = json.loads(out.read_text())
    same = ("finished", "rejected", "preemptions", "jct_s", "queue_delay_s", "makespan_s")
    assert {k: runs["file"][k] for k in same} == {k: runs["flags"][k] for k in same}
    assert runs["file"]["config"]["ordering"] == "drf" and runs["file"]["config"]["backfill"] is True
    overridden = runs["override"]["config"]
    assert overridden["ordering"] == "fifo" and overridden["backfill"] is False
    assert runs["override"]["config"]["preemption"] is True  # from the file
    bad = tmp_path / "bad.yaml"
    bad.write_text("scheduling:\n  ordering: dfr\n")
    refused = CliRunner().invoke(app, [*common, "--config", str(bad), "--json", str(tmp_path / "x.json")])
    assert refused.exit_code == 2 and "line 2: scheduling.ordering" in refused.output
