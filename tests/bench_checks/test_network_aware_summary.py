"""bench/network_aware.py's summary, on hand-made runs: the 95 % intervals, the per-seed ratio to the
better of best-fit and fgd on the same scenario, the option parsing, and `--summarise` re-summarising
and plotting a results JSON without the trace. Every figure in docs/benchmarks.md "Network-aware
placement" and docs/experiments/network-aware.md comes out of these functions."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import network_aware  # noqa: E402

SCENARIO = {"oversub": 2.0, "load": 1.0, "heavy_pct": 60, "failed_links": 0}


def run(variant: str, seed: int, *, origin: str = "packed", scenario: dict[str, Any] | None = None,
        **values: float) -> dict[str, Any]:
    """A row shaped like run_one's: the scenario with its seed, the variant, and every headline key
    (1.0 unless given in `values`)."""
    headline: dict[str, float] = dict.fromkeys(network_aware.KEYS, 1.0)
    headline["wall_s"] = 0.5
    unknown = set(values) - set(headline)
    assert not unknown, f"not headline keys: {unknown}"
    headline.update(values)
    return {"scenario": {**(scenario or SCENARIO), "seed": seed}, "variant": variant, "origin": origin,
            "leaf_nodes": 4, "pod_nodes": 16, "result": {}, **headline}


def entry(summary: list[dict[str, Any]], variant: str, **scenario: Any) -> dict[str, Any]:
    """The one summary row of `variant` on the scenario (SCENARIO with `scenario`'s changes)."""
    want = {**SCENARIO, "origin": "packed", **scenario}
    found = [e for e in summary if e["variant"] == variant and all(e[k] == v for k, v in want.items())]
    assert len(found) == 1, f"{len(found)} rows of {variant} on {want}: {summary}"
    return found[0]


def vs_best_keys(row: dict[str, Any]) -> set[str]:
    return {k for k in row if "_vs_best" in k}


# ---------------------------------------------------------------------------------- interval


@pytest.mark.parametrize(("values", "mean", "half_width"), [
    ([5.0], 5.0, 0.0),
    ([1.0, 3.0], 2.0, 12.706 * math.sqrt(2.0) / math.sqrt(2.0)),       # t(0.975, 1); stdev sqrt(2)
    ([1.0, 2.0, 3.0], 2.0, 4.303 * 1.0 / math.sqrt(3.0)),               # t(0.975, 2); stdev 1
    ([1.0, 2.0, 3.0, 4.0, 5.0], 3.0, 2.776 * math.sqrt(2.5) / math.sqrt(5.0)),  # t(0.975, 4)
    ([7.0, 7.0, 7.0], 7.0, 0.0),
])
def test_interval_is_the_mean_and_the_t_half_width(values: list[float], mean: float,
                                                    half_width: float) -> None:
    got_mean, got_half = network_aware.interval(values)
    assert got_mean == pytest.approx(mean)
    assert got_half == pytest.approx(half_width, rel=5e-4, abs=1e-12)  # t tables quote 4 digits


def test_interval_uses_the_t_distribution_beyond_ten_seeds() -> None:
    values = [float(i) for i in range(11)]  # mean 5, stdev sqrt(11): half-width = t(0.975, 10)
    mean, half = network_aware.interval(values)
    assert mean == pytest.approx(5.0)
    assert half == pytest.approx(2.228, abs=5e-4)


# ---------------------------------------------------------------------------------- summarise


def two_seeds_best_fit_then_fgd() -> list[dict[str, Any]]:
    """Seed 1: best-fit's gangs are faster (100 s < 200 s); seed 2: fgd's are (150 s < 300 s).
    The baseline's other keys point the other way (fgd allocates more on seed 1, queues less), so
    a baseline chosen by any other key, or once per scenario instead of per seed, reads differently."""
    return [
        run("best-fit", 1, gang_jct_mean_s=100.0, gang_queue_p95_s=50.0, jct_mean_s=10.0, alloc_pct=70.0),
        run("fgd", 1, gang_jct_mean_s=200.0, gang_queue_p95_s=10.0, jct_mean_s=5.0, alloc_pct=80.0),
        run("best-fit", 2, gang_jct_mean_s=300.0, gang_queue_p95_s=20.0, jct_mean_s=4.0, alloc_pct=75.0),
        run("fgd", 2, gang_jct_mean_s=150.0, gang_queue_p95_s=40.0, jct_mean_s=8.0, alloc_pct=60.0),
        run("network-aware", 1, gang_jct_mean_s=90.0, gang_queue_p95_s=25.0, jct_mean_s=9.0, alloc_pct=72.0),
        run("network-aware", 2, gang_jct_mean_s=120.0, gang_queue_p95_s=20.0, jct_mean_s=6.0, alloc_pct=66.0),
    ]


def test_summarise_gives_one_row_per_scenario_and_variant_with_its_seeds_counted() -> None:
    rows = [*two_seeds_best_fit_then_fgd(), run("network-aware", 3, gang_jct_mean_s=150.0)]
    summary = network_aware.summarise(rows)
    counted = [(e["variant"], e["seeds"]) for e in summary]
    assert counted == [("best-fit", 2), ("fgd", 2), ("network-aware", 3)]
    for e in summary:
        assert "seed" not in e
        assert {k: e[k] for k in (*SCENARIO, "origin")} == {**SCENARIO, "origin": "packed"}
    na = entry(summary, "network-aware")
    mean, half = network_aware.interval([90.0, 120.0, 150.0])
    assert (na["gang_jct_mean_s"], na["gang_jct_mean_s_ci95"]) == pytest.approx((120.0, half))
    assert mean == pytest.approx(120.0)
    assert na["alloc_pct"] == pytest.approx((72.0 + 66.0 + 1.0) / 3)
    for name in network_aware.KEYS:
        assert name in na and name + "_ci95" in na


def test_vs_best_is_the_per_seed_ratio_to_the_better_of_best_fit_and_fgd() -> None:
    summary = network_aware.summarise(two_seeds_best_fit_then_fgd())
    na = entry(summary, "network-aware")
    # seed 1 against best-fit (100 s), seed 2 against fgd (150 s): 0.9 and 0.8. Always best-fit would
    # give 0.65, always fgd 0.625, the better one over both seeds (fgd, 175 s mean) 0.625, means' ratio 0.84.
    assert na["gang_jct_mean_s_vs_best"] == pytest.approx(0.85)
    half = 12.706 * math.sqrt(0.005) / math.sqrt(2)
    assert na["gang_jct_mean_s_vs_best_ci95"] == pytest.approx(half, rel=5e-4)
    # the other ratios against the same baseline (not the one with the lower queue or JCT of its own)
    assert na["gang_queue_p95_s_vs_best"] == pytest.approx((25.0 / 50.0 + 20.0 / 40.0) / 2)
    assert na["gang_queue_p95_s_vs_best_ci95"] == pytest.approx(0.0, abs=1e-12)
    assert na["jct_mean_s_vs_best"] == pytest.approx((9.0 / 10.0 + 6.0 / 8.0) / 2)
    # allocation: a difference in points, 72 - 70 and 66 - 60
    assert na["alloc_pts_vs_best"] == pytest.approx(4.0)
    assert na["alloc_pts_vs_best_ci95"] == pytest.approx(12.706 * math.sqrt(8.0) / math.sqrt(2), rel=5e-4)
    # the baselines against themselves: 1 on the seed they win, their loss on the other
    assert entry(summary, "best-fit")["gang_jct_mean_s_vs_best"] == pytest.approx((1.0 + 300.0 / 150.0) / 2)
    assert entry(summary, "fgd")["gang_jct_mean_s_vs_best"] == pytest.approx((200.0 / 100.0 + 1.0) / 2)
    assert entry(summary, "fgd")["alloc_pts_vs_best"] == pytest.approx((10.0 + 0.0) / 2)


def test_a_zero_baseline_leaves_that_seed_out_of_the_ratio_instead_of_dividing_by_zero() -> None:
    rows = [run("best-fit", 1, gang_jct_mean_s=100.0, gang_queue_p95_s=0.0),
            run("best-fit", 2, gang_jct_mean_s=100.0, gang_queue_p95_s=40.0),
            run("network-aware", 1, gang_jct_mean_s=50.0, gang_queue_p95_s=30.0),
            run("network-aware", 2, gang_jct_mean_s=50.0, gang_queue_p95_s=10.0)]
    na = entry(network_aware.summarise(rows), "network-aware")
    assert na["gang_queue_p95_s_vs_best"] == pytest.approx(0.25)
    assert na["gang_queue_p95_s_vs_best_ci95"] == 0.0  # one seed
    assert na["gang_jct_mean_s_vs_best"] == pytest.approx(0.5)


@pytest.mark.parametrize("change", [{"oversub": 4.0}, {"load": 1.2}, {"heavy_pct": 0},
                                    {"failed_links": 4}, {"origin": "two-leaves"}],
                         ids=lambda c: next(iter(c)))
def test_a_scenario_without_best_fit_or_fgd_gets_no_vs_best_keys(change: dict[str, Any]) -> None:
    """Baselines on SCENARIO only; the same variant on a scenario that differs in one field has none."""
    origin = change.get("origin", "packed")
    other = {**SCENARIO, **{k: v for k, v in change.items() if k != "origin"}}
    rows = [*two_seeds_best_fit_then_fgd(),
            run("network-aware", 1, scenario=other, origin=origin, gang_jct_mean_s=90.0),
            run("network-aware", 2, scenario=other, origin=origin, gang_jct_mean_s=120.0)]
    summary = network_aware.summarise(rows)
    assert len(summary) == 4
    lone = entry(summary, "network-aware", **change)
    assert vs_best_keys(lone) == set()
    assert lone["gang_jct_mean_s"] == pytest.approx(105.0)
    assert entry(summary, "network-aware")["gang_jct_mean_s_vs_best"] == pytest.approx(0.85)


def test_each_scenario_is_measured_against_its_own_baselines() -> None:
    """Two scenarios with best-fit and fgd each: the baselines of 2:1 never stand in for 4:1's, nor
    those without failed links for those with."""
    four = {**SCENARIO, "oversub": 4.0}
    failed = {**SCENARIO, "failed_links": 4}
    rows = [*two_seeds_best_fit_then_fgd()]
    for scenario, base in ((four, 1000.0), (failed, 400.0)):
        for seed in (1, 2):
            rows += [run("best-fit", seed, scenario=scenario, gang_jct_mean_s=base, alloc_pct=50.0),
                     run("fgd", seed, scenario=scenario, gang_jct_mean_s=2 * base, alloc_pct=90.0),
                     run("network-aware", seed, scenario=scenario, gang_jct_mean_s=base / 2, alloc_pct=53.0)]
    summary = network_aware.summarise(rows)
    assert len(summary) == 9
    assert entry(summary, "network-aware")["gang_jct_mean_s_vs_best"] == pytest.approx(0.85)
    for change in ({"oversub": 4.0}, {"failed_links": 4}):
        na = entry(summary, "network-aware", **change)
        assert na["gang_jct_mean_s_vs_best"] == pytest.approx(0.5)
        assert na["alloc_pts_vs_best"] == pytest.approx(3.0)
        assert na["seeds"] == 2


def test_a_seed_without_baselines_is_left_out_of_the_ratio_only() -> None:
    rows = [*two_seeds_best_fit_then_fgd(), run("network-aware", 3, gang_jct_mean_s=1000.0, alloc_pct=0.0)]
    na = entry(network_aware.summarise(rows), "network-aware")
    assert na["seeds"] == 3
    assert na["gang_jct_mean_s_vs_best"] == pytest.approx(0.85)
    assert na["alloc_pts_vs_best"] == pytest.approx(4.0)


def test_rows_without_an_origin_count_as_packed_and_meet_their_packed_baselines() -> None:
    rows = two_seeds_best_fit_then_fgd()
    for row in rows:
        if row["variant"] == "network-aware":
            del row["origin"]
    summary = network_aware.summarise(rows)
    assert len(summary) == 3
    assert entry(summary, "network-aware")["gang_jct_mean_s_vs_best"] == pytest.approx(0.85)


def test_summarise_of_no_runs_is_empty() -> None:
    assert network_aware.summarise([]) == []


# ---------------------------------------------------------------------------------- options


@pytest.mark.parametrize(("text", "seeds"), [("1-5", [1, 2, 3, 4, 5]), ("1,3", [1, 3]), ("7", [7]),
                                             ("3-3", [3]), ("4-5", [4, 5])])
def test_seeds_take_a_range_or_a_list(text: str, seeds: list[int]) -> None:
    assert network_aware._seeds(text) == seeds


@pytest.mark.parametrize("text", ["x", "1-3,5", "1.5", "1-"])
def test_seeds_that_are_not_integers_raise_value_error(text: str) -> None:
    # _seeds does not check its input: int() raises, and main lets it through (a traceback)
    with pytest.raises(ValueError):
        network_aware._seeds(text)


def test_a_reversed_seed_range_is_refused() -> None:
    with pytest.raises((ValueError, SystemExit)):
        network_aware._seeds("5-1")


@pytest.mark.parametrize(("text", "values"), [("0.8,1.0", [0.8, 1.0]), ("1", [1.0]), ("1,2,", [1.0, 2.0]),
                                              ("0,30,60,100", [0.0, 30.0, 60.0, 100.0]), ("", [])])
def test_floats_split_on_commas_and_skip_empty_items(text: str, values: list[float]) -> None:
    assert network_aware._floats(text) == values


def test_floats_that_are_not_numbers_raise_value_error() -> None:
    with pytest.raises(ValueError):
        network_aware._floats("0.8,high")


# ---------------------------------------------------------------------------------- --summarise


def test_summarise_option_resummarises_a_json_without_the_trace_and_plots_each_fabric(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """matplotlib is a declared dependency and plot() imports it unguarded: without it this test
    fails rather than skips, as the script itself would."""
    one = {**SCENARIO, "oversub": 1.0}
    half = {**SCENARIO, "oversub": 1.5, "failed_links": 4}
    runs = [*two_seeds_best_fit_then_fgd(),
            run("best-fit", 1, scenario=one, gang_jct_mean_s=100.0),
            run("network-aware", 1, scenario=one, gang_jct_mean_s=80.0),
            run("network-aware", 1, scenario=half, origin="two-leaves", gang_jct_mean_s=80.0)]
    path = tmp_path / "grid.json"
    path.write_text(json.dumps({"command": "bench/network_aware.py --seeds 1-2", "wall_s": 12.0,
                                "summary": [{"stale": True}], "runs": runs}))
    plots = tmp_path / "plots"
    not_written = tmp_path / "results.json"

    def no_data_dir() -> Path:
        raise AssertionError("--summarise looked for the trace data")

    monkeypatch.setattr(network_aware, "require_data_dir", no_data_dir)
    monkeypatch.setenv("GPUPOOL_DATA_DIR", str(tmp_path / "no-data"))
    monkeypatch.setattr(sys, "argv", ["network_aware.py", "--summarise", str(path), "--plots", str(plots),
                                      "--json", str(not_written)])
    assert network_aware.main() == 0

    doc = json.loads(path.read_text())
    assert doc["runs"] == runs
    assert (doc["command"], doc["wall_s"]) == ("bench/network_aware.py --seeds 1-2", 12.0)
    assert doc["summary"] == json.loads(json.dumps(network_aware.summarise(runs)))
    assert len(doc["summary"]) == 6
    # the detail defaults to the target scenarios: 2:1 / 1.0 / 60 % / 0 here, not 1:1 or 1.5:1
    assert doc["detail"] == json.loads(json.dumps(network_aware.detail(runs)))
    assert {(e["oversub"], e["variant"]) for e in doc["detail"]} == {
        (2.0, "best-fit"), (2.0, "fgd"), (2.0, "network-aware")}
    assert entry(doc["summary"], "network-aware")["gang_jct_mean_s_vs_best"] == pytest.approx(0.85)
    on_one_to_one = entry(doc["summary"], "network-aware", oversub=1.0)
    assert on_one_to_one["gang_jct_mean_s_vs_best"] == pytest.approx(0.8)
    assert not vs_best_keys(entry(doc["summary"], "network-aware", oversub=1.5, failed_links=4,
                                  origin="two-leaves"))
    assert not not_written.exists()

    pngs = sorted(p.name for p in plots.iterdir())
    assert pngs == ["grid-1.5to1.png", "grid-1to1.png", "grid-2to1.png"]
    for name in pngs:
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert out.count("Plot:") == 3


# ---------------------------------------------------------------------------------- detail


def replay_result(jct_p95: float, nine_to_32: int, *, cross_leaf: float = 0.0) -> dict[str, Any]:
    """A replay result with the fields detail() reads: two gang-size buckets filled, two empty."""
    def bucket(count: int, jct_mean: float) -> dict[str, Any]:
        return {"count": count,
                "jct_s": {"mean": jct_mean, "p50": jct_mean / 2, "p95": jct_p95, "p99": jct_p95 * 2},
                "queue_delay_s": {"mean": 60.0, "p50": 0.0, "p95": 600.0, "p99": 900.0},
                "locality_wait_s": {"mean": 30.0, "p50": 0.0, "p95": 0.0, "p99": 0.0}}
    return {"makespan_s": 7200.0, "cross_leaf_bytes": cross_leaf, "cross_spine_bytes": 2e12,
            "link_util_max": 0.5, "link_util_p99": 0.25,
            "by_gang_size": {"1": bucket(10, 100.0), "9-32": bucket(nine_to_32, 3600.0)},
            "comm": {"gangs_per_bottleneck_mean": 1.5, "gangs_per_bottleneck_max": 3, "hops_mean": 4.0,
                     "lost_gpu_hours": 12.0}}


def test_detail_averages_each_gang_size_and_the_fabric_figures_over_seeds() -> None:
    rows = [{**run("network-aware", 1), "result": replay_result(7200.0, 4, cross_leaf=1e12)},
            {**run("network-aware", 2), "result": replay_result(3600.0, 2, cross_leaf=3e12)}]
    [only] = network_aware.detail(rows, [(2.0, 1.0, 60, 0)])
    assert (only["variant"], only["seeds"]) == ("network-aware", 2)
    assert only["makespan_h"] == pytest.approx(2.0)
    assert only["cross_leaf_tb"] == pytest.approx(2.0)      # (1 + 3) / 2 TB
    assert only["cross_spine_tb"] == pytest.approx(2.0)
    assert (only["link_util_max"], only["link_util_p99"]) == (0.5, 0.25)
    assert (only["gangs_per_bottleneck_mean"], only["gangs_per_bottleneck_max"]) == (1.5, 3)
    assert only["comm_lost_gpu_h"] == pytest.approx(12.0)
    sizes = only["by_gang_size"]
    assert list(sizes) == ["1", "2-8", "9-32", ">32"]
    assert sizes["9-32"]["count"] == pytest.approx(3.0)
    assert sizes["9-32"]["jct_s_p95"] == pytest.approx(5400.0)  # (7200 + 3600) / 2
    assert sizes["9-32"]["jct_s_p99"] == pytest.approx(10800.0)
    assert sizes["9-32"]["jct_s_p50"] == pytest.approx(1800.0)
    assert (sizes["1"]["queue_delay_s_mean"], sizes["1"]["queue_delay_s_p95"]) == (60.0, 600.0)
    assert sizes["1"]["locality_wait_s_mean"] == 30.0
    assert sizes["2-8"]["count"] == 0 and sizes["2-8"]["jct_s_mean"] == 0.0  # absent bucket: zeros


def test_detail_keeps_only_the_chosen_scenarios_by_value_and_splits_by_variant_and_origin() -> None:
    other = {**SCENARIO, "oversub": 4.0}
    rows = [{**run("best-fit", 1), "result": replay_result(1.0, 1)},
            {**run("network-aware", 1), "result": replay_result(1.0, 1)},
            {**run("network-aware", 1, origin="two-leaves"), "result": replay_result(1.0, 1)},
            {**run("network-aware", 1, scenario=other), "result": replay_result(1.0, 1)}]
    found = network_aware.detail(rows, [(2, 1, 60, 0)])  # integers match the runs' floats
    assert [(e["variant"], e["origin"]) for e in found] == [
        ("best-fit", "packed"), ("network-aware", "packed"), ("network-aware", "two-leaves")]
    assert network_aware.detail(rows, []) == []
    assert [e["oversub"] for e in network_aware.detail(rows, [(4.0, 1.0, 60, 0)])] == [4.0]


def test_detail_of_runs_without_a_replay_result_is_zeros_not_an_error() -> None:
    [found] = network_aware.detail([run("fgd", 1)], network_aware.TARGETS[:1])
    assert found["makespan_h"] == 0.0 and found["by_gang_size"]["1"]["count"] == 0


@pytest.mark.parametrize(("text", "scenarios"), [
    ("2:1.0:60:0", [(2.0, 1.0, 60, 0)]),
    ("2:1:60:0;1:0.8:0:4;", [(2.0, 1.0, 60, 0), (1.0, 0.8, 0, 4)]),
    ("", []),
])
def test_scenarios_parse_four_numbers_per_item(text: str, scenarios: list[tuple[Any, ...]]) -> None:
    assert network_aware._scenarios(text) == scenarios


@pytest.mark.parametrize("text", ["2:1:60", "2:1:60:0:1", "2:x:60:0", "2:1:60.5:0"])
def test_a_malformed_scenario_is_refused_in_a_sentence_that_names_it(text: str) -> None:
    with pytest.raises(ValueError, match="is not oversub:load:heavy:links"):
        network_aware._scenarios(text)


def test_bad_only_or_detail_exits_with_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["network_aware.py", "--detail", "2:1:60", "--summarise", "x.json"])
    with pytest.raises(SystemExit) as exc:
        network_aware.main()
    assert exc.value.code == 2
    assert "'2:1:60' is not oversub:load:heavy:links" in capsys.readouterr().err
