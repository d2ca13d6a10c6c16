"""The federated replay (sim/federation.py, `gpupool sim federate`) on jobs small enough to follow by hand.

Two members of one 8-GPU node each: east (home of tenant `a`, 1.0 per GPU-hour) and west (0.6, or
2.0 where a test wants the work to stay east); a 10 Gbit/s link; every data set is a thousandth of
a GB, so moving one takes under a millisecond and costs nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpupool.cli.sim import app
from gpupool.config import PoolConfig
from gpupool.core.federation import Policy, parse_policy
from gpupool.core.metering import HeldSlice, PodInterval
from gpupool.core.model import PodRequest, Workload
from gpupool.core.units import MILLI
from gpupool.errors import InvalidInput
from gpupool.providers.nodespec import nodes_from_spec
from gpupool.sim.federation import Federation, FedSetup, Variant, check_single, draw_datasets
from gpupool.sim.federation_config import FedSpec, load_fed_spec
from gpupool.sim.jobs import TraceJob

REPLAY = Path(__file__).resolve().parents[1] / "fixtures" / "replay"
H = 3600.0
runner = CliRunner()


def spec(west_price: float = 0.6, failure: dict[str, Any] | None = None) -> FedSpec:
    data: dict[str, Any] = {
        "members": [
            {"name": "east", "region": "east", "cluster": "1x8xV100M32", "price_per_gpu_hour": 1.0},
            {"name": "west", "region": "west", "cluster": "1x8xV100M32", "price_per_gpu_hour": west_price},
        ],
        "links": [{"a": "east", "b": "west", "gbit_s": 10}],
        "homes": {"a": "east"},
        "default_home": "east",
        "datasets": {"per_tenant": 1, "median_gb": 0.001, "sigma": 0},
        "wait_price_per_device_hour": 1.0,
    }
    if failure is not None:
        data["failure"] = failure
    return FedSpec.model_validate(data)


def job(i: int, submit_s: float, hours: float, gpus: int = 8) -> TraceJob:
    pod = PodRequest(name="p0", num_devices=gpus, device_milli=MILLI)
    w = Workload(id=f"j{i}", pods=(pod,), tenant="a", queue="default", priority_class="normal",
                 submit_time_s=submit_s, checkpoint_interval_s=1800.0)
    return TraceJob(w, submit_s, hours * H)


def run(fed: FedSpec, jobs: list[TraceJob], policy: str, failure: bool = False) -> dict[str, Any]:
    nodes = {m.name: tuple(nodes_from_spec(m.cluster)) for m in fed.members}
    sizes, holders, per_job = draw_datasets(fed, jobs, 0)
    setup = FedSetup(fed, nodes, tuple(jobs), PoolConfig().policies(), 0, sizes, holders, per_job)
    return Federation(setup, Variant(policy, parse_policy(policy), failure)).run()


THREE = [job(1, 0.0, 1.0), job(2, 1.0, 1.0), job(3, 2.0, 1.0)]


def test_home_queues_at_home_while_the_other_member_idles() -> None:
    r = run(spec(), THREE, "home")
    assert r["finished"] == 3 and r["remote_share"] == 0.0
    assert r["members"]["west"]["utilisation_pct"] == 0.0
    assert r["jct_mean_s"] == pytest.approx((1 + 2 + 3) * H / 3, abs=5)
    assert r["total_cost"] == pytest.approx(24.0, rel=1e-3)  # 3 jobs x 8 GPUs x 1 h x 1.0


def test_balanced_trades_price_against_the_wait() -> None:
    # j1: west is cheaper and free -> west. j2: west now has j1's hour queued (4.8 + 8 x 1 h of
    # waiting = 12.8 > 8.0 at east) -> east. j3: east runs j2 (8 + 8 = 16), west 12.8 -> west.
    r = run(spec(), THREE, "balanced")
    assert r["members"]["west"]["jobs"] == 2 and r["members"]["east"]["jobs"] == 1
    assert r["total_cost"] == pytest.approx(2 * 4.8 + 8.0, rel=1e-3)
    assert r["jct_mean_s"] == pytest.approx((1 + 1 + 2) * H / 3, abs=5)
    assert r["data_moved_gb"] == pytest.approx(0.001)  # j1's set; for j3 west's cache holds it
    # the hub offers work only to members that can start it now, in rank order: cheapest too runs
    # j2 east (west is busy), and queues j3 at its first choice, west
    cheapest = run(spec(), THREE, "cheapest")
    assert (cheapest["members"]["west"]["jobs"], cheapest["members"]["east"]["jobs"]) == (2, 1)
    assert cheapest["total_cost"] == pytest.approx(2 * 4.8 + 8.0, rel=1e-3)


def test_a_failed_member_s_work_moves_from_its_last_checkpoint() -> None:
    # west costs 10: j0 goes east; j1 finds east busy and starts west (the only member free); j2
    # finds both busy and queues at its first choice, east. East fails at 45 min: j2 (queued) is
    # offered again at once and starts west (j1 is done); j0 (running, checkpointed at 30 min) comes
    # back after the 10 min grace with 1.5 h to go, queues at west and runs from 1 h to 2.5 h.
    fed = spec(west_price=10.0, failure={"member": "east", "at_h": 0.75, "for_h": 10, "grace_s": 600})
    jobs = [job(0, 0.0, 2.0), job(1, 1.0, 0.25), job(2, 60.0, 0.25)]
    r = run(fed, jobs, "balanced", failure=True)
    assert r["moved_by_failure"] == 2
    assert r["failure_lost_gpu_hours"] == pytest.approx(8 * 0.25)
    assert r["finished"] == 3
    assert r["jct_mean_s"] == pytest.approx((2.5 * H + 0.25 * H + (H - 60)) / 3, abs=5)
    assert r["members"]["west"]["jobs"] == 3
    # without the failure j0 and j2 stay east
    calm = run(fed, jobs, "balanced")
    assert calm["moved_by_failure"] == 0 and calm["members"]["west"]["jobs"] == 1


def test_a_member_that_cannot_start_an_offer_withdraws_it() -> None:
    # east (2 nodes) runs two 6-GPU jobs, one per node: 4 GPUs free, but 2 + 2. A 4-GPU job ranks
    # east first (1.0 against 10), east's cycle cannot place it, east withdraws it, west starts it.
    data = spec(west_price=10.0).model_dump()
    data["members"][0]["cluster"] = "2x8xV100M32"
    fed = FedSpec.model_validate(data)
    r = run(fed, [job(1, 0.0, 2.0, gpus=6), job(2, 1.0, 2.0, gpus=6), job(3, 2.0, 1.0, gpus=4)], "balanced")
    assert r["members"]["west"]["jobs"] == 1
    # j3 never ran in east: a copy left there would have started once j1 ended
    assert r["members"]["east"]["compute_cost"] == pytest.approx(2 * 6 * 2 * 1.0, rel=1e-4)
    assert r["members"]["west"]["compute_cost"] == pytest.approx(4 * 1 * 10.0, rel=1e-4)
    assert r["queue_mean_s"] == pytest.approx(0.0, abs=0.01)  # only the data set's millisecond


def test_home_work_waits_at_the_hub_while_its_member_is_down() -> None:
    fed = spec(failure={"member": "east", "at_h": 0.0, "for_h": 2, "grace_s": 0})
    r = run(fed, [job(1, 60.0, 1.0)], "home", failure=True)
    assert r["finished"] == 1 and r["remote_share"] == 0.0
    assert r["queue_mean_s"] == pytest.approx(2 * H, abs=5)


def test_check_single_catches_a_workload_running_in_two_members() -> None:
    fed = spec()
    nodes = {m.name: tuple(nodes_from_spec(m.cluster)) for m in fed.members}
    setup = FedSetup(fed, nodes, (), PoolConfig().policies())
    members = Federation(setup, Variant("home", Policy.HOME)).members
    piece = (HeldSlice("V100", 1000, 0),)

    def ran(member: str, pod_id: str, start_s: float, end_s: float) -> None:
        interval = PodInterval(pod_id, "a", "q", "normal", "n", start_s, end_s, piece)
        members[member].meter.intervals.append(interval)  # type: ignore[union-attr]

    ran("east", "j1-0-r0", 0.0, 100.0)
    ran("west", "j1-1-r0", 100.0, 200.0)
    check_single(members)  # one after the other: fine
    ran("west", "j1-2-r0", 50.0, 60.0)
    with pytest.raises(AssertionError, match="j1 ran in east and west at once"):
        check_single(members)


def test_bad_federation_file_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "fed.yaml"
    bad.write_text("members:\n  - {name: east, region: east, cluster: 1x8xV100M32, price_per_gpu_hour: 1.0,"
                   " colour: red}\ndefault_home: east\n")
    with pytest.raises(InvalidInput, match=r"field members\.0\.colour"):
        load_fed_spec(bad)
    bad.write_text("members:\n  - {name: east, region: east, cluster: 1x8xV100M32, price_per_gpu_hour: 1.0}\n"
                   "default_home: north\n")
    with pytest.raises(InvalidInput, match="default_home: 'north' is not a member"):
        load_fed_spec(bad)


def _cli(tmp_path: Path, *extra: str, fed_spec: FedSpec | None = None) -> Any:
    fed = tmp_path / "fed.yaml"
    fed.write_text(json.dumps((fed_spec or spec()).model_dump(mode="json")))
    return runner.invoke(app, ["federate", "--federation", str(fed), "--trace",
                               f"philly:{REPLAY / 'philly_tiny.csv'}", "--json", str(tmp_path / "r.json"),
                               *extra])


def test_cli_runs_the_variants_side_by_side(tmp_path: Path) -> None:
    done = _cli(tmp_path, "--variants", "home,balanced")
    assert done.exit_code == 0, done.output
    rows = json.loads((tmp_path / "r.json").read_text())["variants"]
    assert [r["variant"] for r in rows] == ["home", "balanced"]
    assert all(r["single_member_checked"] for r in rows)
    # teamC's 16-GPU job fits no 8-GPU member: refused in both, the others finish
    assert [(r["finished"], r["refused"]) for r in rows] == [(5, 1), (5, 1)]


def test_cli_failure_variant_moves_work_and_runs_it_once(tmp_path: Path) -> None:
    # the tiny trace's first jobs are running east 2 minutes in, when east goes down for an hour
    failing = spec(west_price=2.0, failure={"member": "east", "at_h": 2 / 60, "for_h": 1, "grace_s": 60})
    done = _cli(tmp_path, "--variants", "balanced,balanced+failure", fed_spec=failing)
    assert done.exit_code == 0, done.output
    calm, failed = json.loads((tmp_path / "r.json").read_text())["variants"]
    assert calm["moved_by_failure"] == 0
    assert failed["moved_by_failure"] >= 1
    assert failed["members"]["west"]["jobs"] > calm["members"]["west"]["jobs"]
    assert failed["failure_lost_gpu_hours"] > 0  # work since the start (no checkpoint yet) is lost
    assert failed["finished"] == calm["finished"] == 5
    assert failed["single_member_checked"]


def test_cli_bad_input_exits_2_with_the_reason(tmp_path: Path) -> None:
    misspelt = _cli(tmp_path, "--variants", "home,balenced")
    assert misspelt.exit_code == 2
    assert "Did you mean 'balanced'" in misspelt.output
    assert "Traceback" not in misspelt.output
    no_failure = _cli(tmp_path, "--variants", "home,balanced+failure")
    assert no_failure.exit_code == 2 and "needs a member that fails" in no_failure.output
    fed = tmp_path / "bad.yaml"
    fed.write_text("members: []\ndefault_home: east\n")
    bad = runner.invoke(app, ["federate", "--federation", str(fed), "--trace",
                              f"philly:{REPLAY / 'philly_tiny.csv'}", "--json", str(tmp_path / "r.json")])
    assert bad.exit_code == 2 and "field members" in bad.output


def _reoffer_case(every_s: float) -> tuple[dict[str, Any], Federation]:
    # west (0.6, two nodes) runs j1 (10 h) and j2 (15 min); east (1.0, one node) takes j3 now. The
    # fluid estimate says west frees in 5.1 h, so j4 (3 h) queues at east behind j3 (1 h). At 901 s
    # west's second node is free: the re-rank at 1200 s moves j4 there (14.4 + no wait against
    # 24 + 0.67 h of waiting at east).
    data = spec().model_dump()
    data["members"][1]["cluster"] = "2x8xV100M32"
    data["reoffer_every_s"], data["reoffer_after_s"] = every_s, 600.0
    fed = FedSpec.model_validate(data)
    jobs = [job(1, 0.0, 10.0), job(2, 1.0, 0.25), job(3, 2.0, 1.0), job(4, 3.0, 3.0)]
    nodes = {m.name: tuple(nodes_from_spec(m.cluster)) for m in fed.members}
    sizes, holders, per_job = draw_datasets(fed, jobs, 0)
    setup = FedSetup(fed, nodes, tuple(jobs), PoolConfig().policies(), 0, sizes, holders, per_job)
    federation = Federation(setup, Variant("balanced", Policy.BALANCED))
    return federation.run(), federation


def test_queued_work_is_re_offered_where_it_starts_sooner_and_ranks_better() -> None:
    r, fed = _reoffer_case(300.0)
    assert r["moved_by_reoffer"] == 1
    (at, wid, src, dst, why), = fed.moves
    assert (at, wid, src, dst) == (1200.0, "j4", "east", "west")
    assert "ranks better under balanced" in why
    j4 = fed.jobs["j4"]
    assert j4.member == "west" and j4.first_start_s == pytest.approx(1200.0)
    assert j4.finished_s == pytest.approx(1200.0 + 3 * H, abs=1)
    # it never ran in east: east's bill is j3's hour only (check_single ran in report())
    assert r["members"]["east"]["compute_cost"] == pytest.approx(8 * 1.0, rel=1e-4)
    # without the re-rank it stays at its first choice and starts when j3 ends
    still, calm = _reoffer_case(0.0)
    assert still["moved_by_reoffer"] == 0 and calm.jobs["j4"].member == "east"
    assert calm.jobs["j4"].first_start_s == pytest.approx(H + 2, abs=1)
    assert r["jct_mean_s"] < still["jct_mean_s"] and r["total_cost"] < still["total_cost"]


def test_re_offer_leaves_home_work_where_it_is() -> None:
    data = spec().model_dump()
    data["reoffer_every_s"], data["reoffer_after_s"] = 60.0, 0.0
    r = run(FedSpec.model_validate(data), THREE, "home")
    assert r["moved_by_reoffer"] == 0 and r["members"]["west"]["utilisation_pct"] == 0.0


HUB_FORM = """
policy: balanced
members:
  - {name: east, url: "http://127.0.0.1:9", token_file: east.token, region: east,
     prices: {gpu_hour: 1.0, windows: [{hours: 22-6, multiplier: 0.5}]}, datasets: [corpus]}
  - {name: west, url: "http://127.0.0.1:10", token_file: west.token, region: west, egress_per_gb: 0.01,
     prices: {gpu_hour: 0.6}}
regions:
  east: {west: {bandwidth_gbps: 10, latency_ms: 40}}
datasets: {corpus: {size_gb: 5}}
tenants:
  a: {home: east}
  b: {home: west}
simulation:
  clusters: {east: 1x8xV100M32, west: 1x8xV100M32}
  datasets: {per_tenant: 1, median_gb: 0.001, sigma: 0}
  reoffer_every_s: 120
"""


def test_the_replay_reads_the_hub_s_fed_yaml(tmp_path: Path) -> None:
    from gpupool.federation.config import load_federation

    fed_file = tmp_path / "fed.yaml"
    fed_file.write_text(HUB_FORM)
    for name in ("east", "west"):
        (tmp_path / f"{name}.token").write_text("gp_x")
        (tmp_path / f"{name}.token").chmod(0o600)
    hub = load_federation(fed_file)  # the hub reads the same file and leaves `simulation` alone
    assert [m.name for m in hub.members] == ["east", "west"] and hub.simulation["clusters"]
    replay = load_fed_spec(fed_file)
    assert replay.homes == {"a": "east", "b": "west"} and replay.default_home == "east"
    assert [m.cluster for m in replay.members] == ["1x8xV100M32", "1x8xV100M32"]
    assert replay.reoffer_every_s == 120 and replay.reoffer_after_s == 600
    east, west = replay.core_members()
    assert east.prices.cost("gpu", 1, 23 * H, 24 * H) == pytest.approx(0.5)  # the hub's UTC window
    link = west.link_to("east")
    assert west.egress_per_gb == 0.01 and link is not None and link.gbit_s == 10.0
    assert east.datasets == frozenset({"corpus"})
    (tmp_path / "east.token").unlink()  # the replay calls no member: no url or token is needed
    del_urls = HUB_FORM.replace('url: "http://127.0.0.1:9", token_file: east.token, ', "")
    fed_file.write_text(del_urls)
    assert load_fed_spec(fed_file).core_members()[0].prices.per_device_hour == {"gpu": 1.0}
    r = run(load_fed_spec(fed_file), THREE, "cheapest")
    # midnight UTC is east's night (0.5 < west's 0.6): the first two go east at its list price 1.0
    assert r["finished"] == 3 and (r["members"]["east"]["jobs"], r["members"]["west"]["jobs"]) == (2, 1)


def test_the_hub_form_s_bad_fields_are_named(tmp_path: Path) -> None:
    fed_file = tmp_path / "fed.yaml"
    fed_file.write_text(HUB_FORM.replace("clusters: {east: 1x8xV100M32, west: 1x8xV100M32}",
                                         "clusters: {east: 1x8xV100M32}"))
    with pytest.raises(InvalidInput, match=r"simulation\.clusters must give every member .*missing west"):
        load_fed_spec(fed_file)
    fed_file.write_text(HUB_FORM.replace("reoffer_every_s: 120", "reoffer_every_s: -1"))
    with pytest.raises(InvalidInput, match=r"field simulation\.reoffer_every_s"):
        load_fed_spec(fed_file)
    fed_file.write_text(HUB_FORM.replace("policy: balanced", "policy: balanced\ncolour: red"))
    with pytest.raises(InvalidInput, match="unknown key 'colour'"):
        load_fed_spec(fed_file)


def test_the_benchmark_s_file_reads_in_the_hub_s_form() -> None:
    fed = load_fed_spec(Path(__file__).resolve().parents[2] / "bench" / "configs" / "federation.yaml")
    east = next(m for m in fed.core_members() if m.name == "east")
    assert east.prices.cost("gpu", 1, 3 * H, 4 * H) == pytest.approx(0.7)  # 22:00 at UTC-5
    assert fed.failure is not None and fed.homes["0e4a51"] == "west"
