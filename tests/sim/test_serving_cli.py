"""`gpupool sim serve`: a run end to end on small inputs, and its bad input as one sentence, exit 2."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpupool.cli.sim import app
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.write import to_ibnetdiscover
from serving_factories import write_profile, write_trace

runner = CliRunner()


@pytest.fixture()
def inputs(tmp_path: Path) -> dict[str, Path]:
    rows = [(0.5 * i, 300 + 97 * (i % 7), 5 + i % 4) for i in range(40)]
    fabric = tmp_path / "tree.topo"
    fabric.write_text(to_ibnetdiscover(fat_tree(4, levels=3, pods=2)))
    return {
        "trace": write_trace(tmp_path / "conv.csv", rows),
        "perf": write_profile(tmp_path / "perf.csv"),
        "fabric": fabric,
        "dir": tmp_path,
    }


def _args(inputs: dict[str, Path], *extra: str) -> list[str]:
    return [
        "serve",
        "--trace",
        f"azure-conv:{inputs['trace']}",
        "--profiles",
        str(inputs["perf"]),
        "--cluster",
        "8x8xH100",
        *extra,
    ]


@pytest.mark.parametrize("mode", ["colocated", "split-hh", "split-hhcap"])
def test_each_mode_runs_and_writes_json(inputs: dict[str, Path], mode: str) -> None:
    out = inputs["dir"] / f"{mode}.json"
    done = runner.invoke(
        app,
        _args(
            inputs,
            "--mode",
            mode,
            "--fabric",
            str(inputs["fabric"]),
            "--placement",
            "network-aware",
            "--router",
            "fabric",
            "--json",
            str(out),
        ),
    )
    assert done.exit_code == 0, done.output
    assert "TTFT50" in done.output
    (run,) = json.loads(out.read_text())
    assert run["finished"] == run["requests"] == 40
    assert run["mode"] == mode
    split = mode != "colocated"
    assert (run["kv_bytes"] > 0) == split
    assert run["kv_bytes"] == (sum(300 + 97 * (i % 7) for i in range(40)) * 327_680 if split else 0)
    assert 0 < run["latency"]["slo_attainment"] <= 1
    assert run["usd_per_hour"] == pytest.approx(8 * 8 * 2.5)  # every H100 of the price book's reference


def test_split_ha_with_a_plot(inputs: dict[str, Path]) -> None:
    plot = inputs["dir"] / "serve.png"
    args = _args(inputs, "--mode", "split-ha", "--rate-scale", "1,2", "--plot", str(plot))
    args[args.index("--cluster") + 1] = "4x8xH100,4x8xA100"
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_a_model_without_a_profile_names_the_ones_there_are(inputs: dict[str, Path]) -> None:
    done = runner.invoke(app, _args(inputs, "--model", "mistral-7b"))
    assert done.exit_code == 2
    assert "profiles exist for: llama2-70b" in done.output and "Traceback" not in done.output


def test_hardware_without_a_profile_names_the_ones_there_are(inputs: dict[str, Path]) -> None:
    args = _args(inputs)
    args[args.index("--cluster") + 1] = "8x8xT4"
    done = runner.invoke(app, args)
    assert done.exit_code == 2
    assert "of a profiled kind (H100-SXM-80GB, A100-80GB); this cluster has T4" in done.output


def test_a_cluster_too_small_for_one_instance_says_how_much_memory_it_needs(inputs: dict[str, Path]) -> None:
    done = runner.invoke(app, _args(inputs, "--tp", "1"))
    assert done.exit_code == 2
    assert "One llama2-70b instance needs 146 GiB of device memory" in done.output
    assert "1 x H100-SXM-80GB hold 80 GiB" in done.output


def test_a_trace_without_its_columns_names_them(inputs: dict[str, Path]) -> None:
    bad = inputs["dir"] / "bad.csv"
    bad.write_text("TIMESTAMP,Prompt,Output\n2023-11-16 12:00:00.0,10,10\n")
    args = _args(inputs)
    args[args.index("--trace") + 1] = f"azure-code:{bad}"
    done = runner.invoke(app, args)
    assert done.exit_code == 2
    assert "lacks the columns ContextTokens, GeneratedTokens" in done.output


def test_bad_choices_are_refused(inputs: dict[str, Path]) -> None:
    for extra, text in (
        (("--mode", "split-xx"), "--mode 'split-xx' is not one of"),
        (("--placement", "random"), "--placement 'random' is not one of"),
        (("--rate-scale", "fast"), "numbers separated by commas"),
    ):
        done = runner.invoke(app, _args(inputs, *extra))
        assert done.exit_code == 2 and text in done.output, done.output
    wrong = runner.invoke(app, ["serve", "--trace", "philly:x.csv", "--cluster", "1x8xH100"])
    assert wrong.exit_code == 2 and "KIND:FILE" in wrong.output


def test_poisson_arrivals_keep_the_requests_in_order_seeded(inputs: dict[str, Path]) -> None:
    from gpupool.sim.serving.trace import load_azure

    raw = load_azure(inputs["trace"])
    one = load_azure(inputs["trace"], 2.0, poisson_seed=7)
    assert [(r.prompt_tokens, r.output_tokens) for r in one] == [
        (r.prompt_tokens, r.output_tokens) for r in raw
    ]
    assert one == load_azure(inputs["trace"], 2.0, poisson_seed=7)  # seeded
    assert one != load_azure(inputs["trace"], 2.0, poisson_seed=8)
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(one)]
    assert len(set(gaps)) > 1 and all(g >= 0 for g in gaps)
    assert one[0].arrival_s == 0.0


def _priced(inputs: dict[str, Path], book_text: str) -> tuple[dict[str, Any], Path]:
    """A colocated run priced by a book of `book_text`: its JSON record, and the book's file."""
    book = inputs["dir"] / "prices.yaml"
    book.write_text(book_text)
    out = inputs["dir"] / "priced.json"
    done = runner.invoke(app, _args(inputs, "--mode", "colocated", "--prices", str(book), "--json", str(out)))
    assert done.exit_code == 0, done.output
    (run,) = json.loads(out.read_text())
    return run, book


def test_a_price_book_prices_the_requests(inputs: dict[str, Path]) -> None:
    run, book = _priced(inputs, "prices:\n  versions:\n    - devices: {H100: 4.0}\n")
    assert run["usd_per_hour"] == pytest.approx(8 * 8 * 4.0)
    assert run["requests_per_usd"] == pytest.approx(run["rate_rps"] * 3600 / 256.0)
    book.write_text("prices:\n  versions:\n    - devices: {H100: -1}\n")
    refused = runner.invoke(app, _args(inputs, "--prices", str(book)))
    assert refused.exit_code == 2 and "Traceback" not in refused.output


def test_a_price_version_not_yet_in_force_does_not_price_the_trace(inputs: dict[str, Path]) -> None:
    """The run stands for the trace's hours (2023-11-16, 12:00 UTC): the version in force then prices
    it, not a newer one, whether that takes effect the next day or decades ahead."""
    run, _ = _priced(inputs, "prices:\n  versions:\n"
                     "    - {effective_from: 2020-01-01, devices: {H100: 4.0}}\n"
                     "    - {effective_from: 2023-11-17, devices: {H100: 2.0}}\n"
                     "    - {effective_from: 2099-01-01, devices: {H100: 1.0}}\n")
    assert run["usd_per_hour"] == pytest.approx(8 * 8 * 4.0)
    assert run["requests_per_usd"] == pytest.approx(run["rate_rps"] * 3600 / 256.0)


def test_mixed_pool_and_rails_reach_the_run(inputs: dict[str, Path]) -> None:
    out = inputs["dir"] / "mixed.json"
    extra = (
        "--mode",
        "split-hh",
        "--prefill-share",
        "0.125",
        "--mixed-pool",
        "--rails",
        "8",
        "--rate-scale",
        "1000",
    )
    done = runner.invoke(app, _args(inputs, *extra, "--json", str(out)))
    assert done.exit_code == 0, done.output
    (run,) = json.loads(out.read_text())
    assert run["mixed_pool"] is True and run["finished"] == 40
    assert (
        run["prompts_on_decode_instances"] > 0
    )  # one prefill instance, 40 prompts at once: its queue overflows
    bad = runner.invoke(app, _args(inputs, "--rails", "0"))
    assert bad.exit_code == 2 and "--rails must be 1 to 16" in bad.output


def test_routing_reaches_the_run_and_a_bad_one_is_refused(inputs: dict[str, Path]) -> None:
    seen = {}
    for routing in ("static", "pooled"):
        out = inputs["dir"] / f"{routing}.json"
        fab = ("--fabric", str(inputs["fabric"]), "--routing", routing, "--json", str(out))
        done = runner.invoke(app, _args(inputs, "--mode", "split-hh", *fab))
        assert done.exit_code == 0, done.output
        (run,) = json.loads(out.read_text())
        seen[routing] = (run["routing"], run["finished"])
    assert seen == {"static": ("static", 40), "pooled": ("pooled", 40)}
    bad = runner.invoke(app, _args(inputs, "--routing", "ecmp"))
    assert bad.exit_code == 2 and "--routing must be static or pooled" in bad.output
    assert "Traceback" not in bad.output


def test_an_unwritable_json_path_is_one_sentence_and_exit_2(inputs: dict[str, Path]) -> None:
    blocker = inputs["dir"] / "a-file"
    blocker.write_text("")
    done = runner.invoke(app, _args(inputs, "--json", str(blocker / "out.json")))
    assert done.exit_code == 2, done.output  # the caller's path: bad usage, as every `gpupool sim` command
    assert "cannot write output (" in done.output and str(blocker) in done.output
    assert "Traceback" not in done.output
