"""Services and batch in the replay (sim/colocation.py): the demand model, the variants' invariants
on tiny synthetic pools, determinism and the command's bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.sim import app
from gpupool.cli.sim_colocate import serving_setup
from gpupool.config import PoolConfig
from gpupool.core.model import PodRequest, Workload
from gpupool.errors import InvalidInput, TraceError
from gpupool.providers.nodespec import nodes_from_spec
from gpupool.sim.colocation import (
    ColocationReplay,
    ColocationSetup,
    parse_variants,
    run_all,
    run_variant,
    scale_batch,
    service_jobs,
    thin_instances,
)
from gpupool.sim.jobs import TraceJob
from gpupool.sim.traces.alibaba_serving import ServiceInstance, load_instances

FIXTURES = Path(__file__).parents[1] / "fixtures"
SERVICES = FIXTURES / "colocation" / "alibaba_tiny.csv"
PHILLY = FIXTURES / "replay" / "philly_tiny.csv"
SERVING = serving_setup(PoolConfig())


def replica(line: int, start: float, end: float, gpus: float = 1.0, app: str = "app") -> ServiceInstance:
    return ServiceInstance(line=line, name=f"i{line}", app=app, role="HN", gpus=gpus, start_s=start,
                           end_s=end, created_in_trace=start > 0)


def batch_job(name: str, gpus: int, duration: float, at: float = 0.0) -> TraceJob:
    w = Workload(id=name, pods=(PodRequest(name="p0", num_devices=gpus, device_milli=1000),), tenant="t",
                 queue="default", priority_class="normal", submit_time_s=at, checkpoint_interval_s=1800.0)
    return TraceJob(w, at, duration)


def setup(spec: str, instances: list[ServiceInstance], batch: list[TraceJob], end_s: float,
          headroom: int = 0, **kw: object) -> ColocationSetup:
    given = {**SERVING, "headroom_replicas": headroom, **kw}
    return ColocationSetup(nodes=tuple(nodes_from_spec(spec)), instances=tuple(instances), batch=tuple(batch),
                           end_s=end_s, check_invariants=True, **given)


# ------------------------------------------------------------------ the demand model


def test_instances_from_the_trace_treat_missing_times_as_live_before_and_after() -> None:
    got = {i.name: i for i in load_instances(SERVICES)}
    # the CPU-only row (gpu_request 0) is no replica
    assert set(got) == {"instance_0", "instance_1", "instance_3", "instance_4"}
    assert got["instance_0"].start_s == 0.0 and math.isinf(got["instance_0"].end_s)
    assert not got["instance_0"].created_in_trace and got["instance_1"].created_in_trace
    assert (got["instance_1"].start_s, got["instance_1"].end_s) == (100.0, 3000.0)
    assert got["instance_3"].start_s == 0.0 and got["instance_3"].end_s == 2000.0
    assert got["instance_4"].gpus == 0.5 and math.isinf(got["instance_4"].end_s)
    jobs = {j.workload.id: j for j in service_jobs(list(got.values()), fractional=True)}
    assert jobs["svc-app_b-5"].workload.total_device_milli == 500
    whole = {j.workload.id: j for j in service_jobs(list(got.values()))}
    assert whole["svc-app_b-5"].workload.total_device_milli == 1000
    assert whole["svc-app_a-3"].workload.priority_class == "serving"  # the pool's serving class


def test_missing_columns_and_bad_rows_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("instance_sn,app_name,gpu_request\ni0,a,1\n")
    with pytest.raises(TraceError, match="role, creation_time, deletion_time"):
        load_instances(bad)
    rows = SERVICES.read_text().splitlines()
    bad.write_text("\n".join([rows[0], rows[2].replace("3000.0", "soon")]) + "\n")
    with pytest.raises(TraceError, match=r"bad.csv:2: deletion_time must be seconds"):
        load_instances(bad)
    bad.write_text("\n".join([rows[0], rows[2].replace("100.0,100.0,3000.0", "300.0,300.0,200.0")]) + "\n")
    with pytest.raises(TraceError, match="before creation_time"):
        load_instances(bad)


def test_thinning_keeps_each_apps_shape_and_the_seed_picks_which() -> None:
    many = [replica(i, float(i), 1e6, app="a" if i % 2 else "b") for i in range(1, 33)]
    kept = thin_instances(many, 4, seed=1)
    assert len(kept) == 8 and {i.app for i in kept} == {"a", "b"}
    assert [i.line for i in thin_instances(many, 4, seed=2)] != [i.line for i in kept]
    with pytest.raises(InvalidInput, match="whole number >= 1"):
        thin_instances(many, 0)


def test_batch_scale_clones_on_average_and_moves_the_window_to_zero() -> None:
    jobs = [batch_job(f"j{i}", 1, 60.0, at=1000.0 + i) for i in range(400)]
    scaled = scale_batch(jobs, 1.5, seed=7, shift_s=1000.0)
    assert 560 <= len(scaled) <= 640 and scaled[0].submit_s == 0.0
    assert len({j.workload.id for j in scaled}) == len(scaled)
    assert scale_batch(jobs, 1.5, seed=7, shift_s=1000.0) == scaled


# ------------------------------------------------------------------ the variants' invariants


def test_static_split_never_puts_batch_on_the_inference_pool() -> None:
    s = setup("2x4xA100-80GB", [replica(1, 0.0, math.inf)], [batch_job(f"b{i}", 1, 1000.0) for i in range(8)],
              end_s=5000.0)
    runs: list[ColocationReplay] = []
    static = run_variant(s, "static", runs)
    serving, batch = runs
    assert {n.name for n in serving.config.nodes}.isdisjoint({n.name for n in batch.config.nodes})
    assert all(j.job.workload.id.startswith("svc-") for j in serving.jobs.values())
    assert static["inference_devices"] == 4 and static["batch_devices"] == 4
    assert max(p[2] for p in static["timeline"]) == 4.0  # batch holds at most its own cluster
    assert static["batch_finished"] == 8 and static["batch_jct_s"]["p95"] >= 2000.0  # two waves
    colocated = run_variant(s, "colocated")
    assert max(p[2] for p in colocated["timeline"]) == 7.0  # one pool: all but the replica's device
    assert colocated["batch_jct_s"]["p95"] < static["batch_jct_s"]["p95"]


def test_colocation_preempts_batch_only_when_a_replica_needs_room() -> None:
    late = [replica(1, 100.0, 5000.0)]
    full = run_variant(setup("1x4xA100-80GB", late, [batch_job("b", 4, 10_000.0)], 6000.0), "colocated")
    assert full["preemptions"] == 1 and full["service_preemptions"] == 0
    assert full["service_on_time_pct"] == 100.0 and full["time_to_ready_s"]["p99"] == 30.0
    assert full["lost_batch_gpu_hours"] == pytest.approx(4 * 100 / 3600)  # no checkpoint yet at 100 s
    roomy = run_variant(setup("1x4xA100-80GB", late, [batch_job("b", 3, 10_000.0)], 6000.0), "colocated")
    assert roomy["preemptions"] == 0 and roomy["batch_jct_s"]["mean"] == 10_000.0
    assert roomy["service_on_time_pct"] == 100.0


def test_headroom_keeps_capacity_free_from_new_batch() -> None:
    instances = [replica(1, 0.0, math.inf), replica(2, 100.0, 3000.0)]
    batch = [batch_job(f"b{i}", 1, 5000.0) for i in range(10)]
    s = setup("2x4xA100-80GB", instances, batch, 6000.0, headroom=2)
    held = run_variant(s, "headroom")
    assert max(p[2] for p in held["timeline"]) == 5.0  # 8 devices - 1 replica - 2 kept free
    assert held["headroom_breaches"] == 0 and held["headroom_held_cycles"] > 0
    assert held["preemptions"] == 0 and held["service_on_time_pct"] == 100.0  # the rise found room
    packed = run_variant(s, "colocated")
    assert max(p[2] for p in packed["timeline"]) == 7.0
    assert packed["preemptions"] == 1  # the rise had to take a batch job's device


def test_headroom_is_the_cores_rule_in_replicas_of_the_largest_replicas_shape() -> None:
    # half-device replicas: room for 2 more is one half-free device plus one free device, so batch may
    # take two whole devices of four (a rule in devices, 2 kept free, would have left it one); the
    # batch held back waits with the live pool's reason, counted per cycle
    s = setup("1x4xA100-80GB", [replica(1, 0.0, math.inf, gpus=0.5)],
              [batch_job(f"b{i}", 1, 1000.0) for i in range(4)], 3000.0, headroom=2)
    runs: list[ColocationReplay] = []
    frac = run_variant(s, "fractional", runs)
    policies = runs[0].config.policies
    assert policies.headroom is not None and (policies.headroom.num_devices, policies.headroom.device_milli,
                                              policies.headroom.replicas) == (1, 500, 2)
    assert "serving" in policies.headroom.exempt_classes
    assert max(p[2] for p in frac["timeline"]) == 2.0
    assert frac["headroom_held_cycles"] > 0 and frac["headroom_breaches"] == 0
    assert frac["headroom_reservations"] == 0  # a head held only by the room gets no backfill reservation
    assert frac["batch_finished"] == 4 and frac["batch_jct_s"]["mean"] == pytest.approx(1500.0)


def test_the_configuration_gives_the_class_and_headroom(tmp_path: Path) -> None:
    config = PoolConfig.model_validate({"serving": {"headroom_replicas": 3, "priority_class": "gold",
                                                    "classes": [{"name": "gold", "value": 700}]}})
    s = setup("1x4xA100-80GB", [replica(1, 0.0, 100.0)], [], 200.0, **{**serving_setup(config)})
    runs: list[ColocationReplay] = []
    run_variant(s, "headroom", runs)
    assert {j.job.workload.priority_class for j in runs[0].jobs.values()} == {"gold"}
    assert runs[0].config.policies.headroom is not None
    assert runs[0].config.policies.headroom.replicas == 3
    assert runs[0].config.policies.headroom.exempt_classes == frozenset({"gold"})
    result = CliRunner().invoke(app, ["colocate", "--headroom", "-1", "--json", str(tmp_path / "x.json")])
    assert result.exit_code == 2 and "serving.headroom_replicas" in result.output
    from gpupool.cli.sim_colocate import build_setup

    packed = build_setup(SERVICES, PHILLY, "4x8xA100-80GB", 1.0, "2017-10-01", 1, 2, 30.0, 30.0, thin=1,
                         placement="best-fit")
    assert packed.policies.placement == "best-fit" and packed.headroom_replicas == 2
    assert packed.service_class == "serving" and packed.policies.preemption
    result = CliRunner().invoke(app, ["colocate", "--services", str(SERVICES), "--batch", str(PHILLY),
                                      "--placement", "best-fitt", "--json", str(tmp_path / "x.json")])
    assert result.exit_code == 2 and "best-fit" in result.output and "Traceback" not in result.output


def test_fractional_replicas_pack_and_leave_whole_devices_to_batch() -> None:
    halves = [replica(i, 0.0, 1000.0, gpus=0.5) for i in range(1, 5)]
    s = setup("1x4xA100-80GB", halves, [batch_job("b", 2, 600.0, at=10.0)], 2000.0)
    frac = run_variant(s, "fractional")
    whole = run_variant(s, "headroom")
    assert frac["batch_jct_s"]["mean"] == 600.0  # four halves on two devices: two left for batch
    assert whole["batch_jct_s"]["mean"] == pytest.approx(1000.0 - 10.0 + 600.0)  # waits for the replicas
    assert frac["service_gpu_hours_window"] == pytest.approx(4 * 0.5 * 1000 / 3600)
    shared = run_variant(setup("1x4xA100-80GB", [replica(1, 0.0, 1000.0)], [], 1000.0, assume_share=0.25),
                         "fractional")
    assert shared["service_gpu_hours_window"] == pytest.approx(0.25 * 1000 / 3600)


def test_a_replica_whose_demand_ends_before_it_is_placed_is_dropped_and_counted_late() -> None:
    # a non-preemptible replica holds the only device; the second one's demand comes and goes unserved
    s = setup("1x1xA100-80GB", [replica(1, 0.0, 5000.0), replica(2, 100.0, 400.0)], [], 6000.0)
    r = run_variant(s, "colocated")
    assert r["replicas_never_placed"] == 1
    assert r["service_on_time_pct"] == pytest.approx(100 * 5000 / 5300)


def test_same_seed_same_numbers() -> None:
    instances = [replica(i, 50.0 * i, 50.0 * i + 300, gpus=0.5 if i % 3 == 0 else 1.0) for i in range(1, 12)]
    batch = [batch_job(f"b{i}", 1 + i % 3, 300.0 + 37 * i, at=20.0 * i) for i in range(30)]
    s = setup("4x4xA100-80GB", instances, batch, 2000.0, headroom=1)

    def strip(result: dict) -> dict:
        for r in result["variants"].values():
            r.pop("wall_s")
        return result

    assert strip(run_all(s)) == strip(run_all(s))


# ------------------------------------------------------------------ the command


def test_unknown_variant_names_the_nearest() -> None:
    with pytest.raises(InvalidInput, match="Did you mean 'colocated'"):
        parse_variants("static,colocted")
    assert parse_variants("fractional, static") == ("static", "fractional")
    result = CliRunner().invoke(app, ["colocate", "--variants", "headrom", "--json", "x.json"])
    assert result.exit_code == 2 and "headroom" in result.output and "Traceback" not in result.output


def test_cli_missing_trace_columns_exit_2_naming_them(tmp_path: Path) -> None:
    bad = tmp_path / "svc.csv"
    bad.write_text("instance_sn,role,app_name,gpu_request\ni0,HN,a,1\n")
    result = CliRunner().invoke(app, ["colocate", "--services", str(bad), "--batch", str(PHILLY),
                                      "--json", str(tmp_path / "o.json")])
    assert result.exit_code == 2, result.output
    assert "creation_time, deletion_time" in result.output and "Traceback" not in result.output


def test_cli_runs_the_four_variants_on_fixtures(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    result = CliRunner().invoke(app, ["colocate", "--services", str(SERVICES), "--batch", str(PHILLY),
                                      "--cluster", "4x8xA100-80GB", "--service-thin", "1",
                                      "--batch-scale", "1", "--seed", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data["variants"]) == {"static", "colocated", "headroom", "fractional"}
    assert data["variants"]["static"]["inference_devices"] == 8
    assert all(r["service_on_time_pct"] == 100.0 for r in data["variants"].values())
    assert set(data["vs_static"]) == {"colocated", "headroom", "fractional"}
    out2 = tmp_path / "d.json"
    result = CliRunner().invoke(app, ["colocate", "--variants", "static", "--services", str(SERVICES),
                                      "--batch", str(PHILLY), "--service-thin", "1", "--batch-nodes", "3",
                                      "--json", str(out2)])
    assert result.exit_code == 0, result.output
    static = json.loads(out2.read_text())["variants"]["static"]
    assert (static["inference_devices"], static["batch_devices"]) == (8, 24)  # a peak of 4 replicas: one node


def test_batch_that_never_finds_room_is_counted_and_its_jct_bounded_below() -> None:
    # a replica that stays to the end keeps one of four devices: a 4-device gang never starts
    s = setup("1x4xA100-80GB", [replica(1, 0.0, math.inf), replica(2, 0.0, 500.0)],
              [batch_job("wide", 4, 100.0, at=10.0), batch_job("narrow", 2, 100.0, at=10.0)], 1000.0)
    r = run_variant(s, "colocated")
    assert (r["batch_finished"], r["batch_unfinished"]) == (1, 1)
    assert r["batch_jct_s"]["mean"] == 100.0
    assert r["batch_jct_with_unfinished_s"]["mean"] == pytest.approx((100.0 + (500.0 - 10.0)) / 2)
    assert r["batch_unfinished_by_gpus"] == {"4": 1}  # the starved gang, counted with its work
    assert r["batch_unfinished_gpu_hours"] == pytest.approx(4 * 100.0 / 3600)


def test_an_instance_end_removes_the_apps_replica_on_the_emptiest_node() -> None:
    """serving.pack_replicas: when an app's instance ends, the replica removed is the app's on the
    emptiest node (the core's `emptiest_first`), and the ending one serves that one's demand; a node
    the replicas left whole lets a gang start that would otherwise never find one."""
    app = [replica(1, 0.0, 500.0), replica(2, 0.0, math.inf), replica(3, 0.0, math.inf)]
    gang = [batch_job("gang", 2, 100.0, at=10.0)]
    runs: list[ColocationReplay] = []
    packed = run_variant(setup("2x2xA100-80GB", app, gang, 2000.0), "colocated", runs)
    where = {wid: runs[0].view.running[wid].allocs[0][1].node
             for wid in runs[0].view.running if wid.startswith("svc-")}
    assert len(where) == 2 and len(set(where.values())) == 1  # the two left share one node
    assert packed["consolidations"] == 1 and packed["batch_finished"] == 1
    assert packed["service_on_time_pct"] == 100.0  # every instance's demand still served
    trace = run_variant(setup("2x2xA100-80GB", app, gang, 2000.0, consolidate=False), "colocated")
    assert trace["consolidations"] == 0 and trace["batch_unfinished_by_gpus"] == {"2": 1}
