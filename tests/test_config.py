"""The one configuration file: the issue's example as written, defaults, errors by field and line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cli_inproc import run_cli
from factories import ISSUE_CONFIG
from gpupool.config import PoolConfig, load_config, parse_config
from gpupool.core.quota import DEVICE_MILLI
from gpupool.core.scheduling.locality import WaitCap
from gpupool.errors import InvalidInput


def test_the_example_is_accepted_as_written() -> None:
    config = parse_config(ISSUE_CONFIG)
    policies = config.policies()
    assert (policies.placement, policies.ordering, policies.preemption, policies.backfill) == (
        "fgd-strand", "drf", True, True)
    assert [(c.name, c.value, c.preemptible) for c in policies.priority_classes.classes] == [
        ("low", 0, True), ("high", 1000, True), ("serving", 500, True)]  # services' class (serving.classes)
    assert config.grace_s("low") == 5.0 and config.grace_s("high") == config.scheduling.preemption_grace


def test_defaults_and_round_trip() -> None:
    default = PoolConfig()
    assert parse_config("") == default == load_config(None)
    assert parse_config(default.to_yaml()) == default
    configured = parse_config(ISSUE_CONFIG + "queues:\n  - {tenant: a, quota: 8, cohort: research}\n")
    assert parse_config(configured.to_yaml()) == configured


def test_the_wait_cap_reaches_the_cycle() -> None:
    assert PoolConfig().policies().locality_wait_cap is WaitCap.FIXED
    config = parse_config("scheduling:\n  topology_max_wait: 10m\n  topology_wait_cap: loss\n")
    policies = config.policies()
    assert policies.locality_wait_cap is WaitCap.LOSS and policies.max_locality_wait_s == 600.0
    queue = parse_config("scheduling: {topology_wait_cap: queue, topology_wait_ceiling: 2h}").policies()
    assert queue.locality_wait_cap is WaitCap.QUEUE and queue.max_locality_wait_ceiling_s == 7200.0
    assert PoolConfig().policies().max_locality_wait_ceiling_s == float("inf")


def test_queues_become_cluster_queues_in_their_cohorts() -> None:
    config = parse_config("""\
queues:
  - {tenant: a, name: train, quota: 8, cohort: research, borrowing_limit: 4, lending_limit: 2, weight: 2}
  - {tenant: b, quota: 0.5, cohort: research}
  - {tenant: c}
""")
    quota = config.policies().quota
    by_name = {cq.name: cq for cq in quota.cluster_queues}
    assert set(by_name) == {"a/train", "b/default", "c/default"}  # as the server: every queue is one
    assert by_name["c/default"].quotas == {}  # c has no cap
    train = by_name["a/train"].quotas[DEVICE_MILLI]
    assert (train.nominal, train.borrowing_limit, train.lending_limit) == (8000, 4000, 2000)
    other = by_name["b/default"]
    assert other.quotas[DEVICE_MILLI].nominal == 500 and other.cohort == "research"
    assert quota.route() == {("a", "train"): "a/train", ("b", "default"): "b/default",
                             ("c", "default"): "c/default"}
    assert quota.weight("a") == 2.0 and quota.weight("c") == 1.0


@pytest.mark.parametrize(("text", "expected"), [
    ("scheduling:\n  placement: fgdd\n", "line 2: scheduling.placement: unknown placement policy 'fgdd'"),
    ("scheduling:\n  ordering: dfr\n", "Did you mean 'drf'?"),
    ("scheduling:\n  plaement: fgd\n", "line 2: scheduling.plaement: unknown field 'plaement'"),
    ("apiVersion: v1\n", "line 1: apiVersion: unknown field 'apiVersion'"),
    ("priority_classes:\n  - {name: x, value: 1}\n  - {name: y, value: 2, grace: soon}\n",
     "line 3: priority_classes[1].grace: a duration is"),
    ("priority_classes:\n  - {name: x, value: 1}\n  - {name: x, value: 2}\n", "x appear twice"),
    ("queues:\n  - {tenant: b, quota: 2, lending_limit: 3}\n",
     "lending_limit (3) cannot exceed its quota (2)"),
    ("queues:\n  - {tenant: b, quota: -1}\n",
     "line 2: queues[0].quota: Input should be greater than or equal"),
    ("scheduling:\n  placement: fgd\n  placement_options: {bogus: 1}\n",
     "line 3: scheduling.placement_options"),
    ("defaults:\n  memory_per_gpu: lots\n", "defaults.memory_per_gpu"),
    ("scheduling:\n  topology_wait_cap: lossy\n",
     "line 2: scheduling.topology_wait_cap: Input should be 'fixed', 'loss' or 'queue'"),
    ("scheduling:\n  topology_max_wait: 10m\n  topology_wait_ceiling: 5m\n",
     "line 3: scheduling.topology_wait_ceiling: the ceiling (300 s) cannot be below "
     "topology_max_wait (600 s)"),
    ("scheduling: [1,\n", "not valid YAML"),
    ("scheduling:\n  placement: fgd\n  placement: first-fit\n",
     "line 3: this is not valid YAML (the key 'placement' appears twice in one mapping (first on line 2)"),
    ("queues:\n  - {tenant: a, quota: 1, quota: 9}\n", "line 2: this is not valid YAML (the key 'quota'"),
    ("failure: {max_retries: 1}\nfailure: {max_retries: 2}\n", "the key 'failure' appears twice"),
    ("queues:\n  - {tenant: Team_A}\n", "line 2: queues[0].tenant: 'Team_A' cannot be stored"),
    ("- a\n- b\n", "must be a mapping of sections"),
    ("prices:\n  versions:\n    - effective_from: 2026-13-01\n",
     "line 3: this is not valid YAML ('2026-13-01' is not a date or time (month must be in 1 to 12)"),
])
def test_a_bad_file_is_one_sentence_per_problem_with_field_and_line(text: str, expected: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_config(text, "pool.yaml")
    message = caught.value.message
    assert message.startswith("pool.yaml") and expected in message, message
    assert "\n" not in message and ".." not in message and "?." not in message


def test_every_problem_of_a_file_is_listed() -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_config("scheduling:\n  placement: nope\n  ordering: nada\nfailure:\n  max_retries: -1\n",
                     "p.yaml")
    problems = caught.value.details["problems"]
    assert [p.split(":")[0] for p in problems] == ["p.yaml line 2", "p.yaml line 3", "p.yaml line 5"]


def test_config_check_says_one_problem_a_line_in_line_order(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"  # failure comes before scheduling in the file, after it in the model
    path.write_text("failure:\n  max_retries: -1\nscheduling:\n  backfil: true\n  ordering: nada\n")
    checked = run_cli(["config", "check", str(path)], os.environ)
    assert checked.returncode == 2 and checked.stdout == ""
    lines = checked.stderr.splitlines()
    assert [line.split(":")[1] for line in lines] == [f" {path} line 2", f" {path} line 4", f" {path} line 5"]
    assert all(line.startswith("Error: ") and line.endswith((".", "?")) for line in lines), lines
    assert "Did you mean 'backfill'?" in lines[1]


def test_config_cli_show_and_check(tmp_path: Path) -> None:
    good, bad = tmp_path / "pool.yaml", tmp_path / "bad.yaml"
    good.write_text(ISSUE_CONFIG)
    bad.write_text("scheduling:\n  ordering: dfr\n")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(["config", *args], os.environ)

    shown = cli("show", "--config", str(good))
    assert shown.returncode == 0 and parse_config(shown.stdout) == parse_config(ISSUE_CONFIG)
    assert cli("check", str(good)).stdout.strip() == "ok"
    refused = cli("check", str(bad))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "line 2: scheduling.ordering" in refused.stderr
    missing = cli("check", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "No configuration file" in missing.stderr


def test_a_file_that_is_not_utf8_is_refused_in_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_bytes("scheduling:\n  placement: fgd # caf\u00e9\n".encode("latin-1"))
    with pytest.raises(InvalidInput) as caught:
        load_config(path)
    assert caught.value.message == (f"Cannot read the configuration file {str(path)!r}: it is not UTF-8 text "
                                    "(byte 0xe9 on line 2); save it as UTF-8.")


def test_config_check_refuses_what_up_refuses(tmp_path: Path) -> None:
    # `config check` said ok to tenant names `up` then refused; and a non-UTF-8 file was a traceback
    files = {"names.yaml": b"queues:\n  - {tenant: Team_A, quota: 1}\n",
             "latin1.yaml": "queues: [] # \u00e9\n".encode("latin-1"),
             "twice.yaml": b"queues: []\nqueues: []\n"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        for args in (["config", "check", name], ["up", "--data-dir", "d", "--config", name]):
            done = run_cli(args, os.environ, cwd=tmp_path)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("Error: "), (args, done)
            assert "Traceback" not in done.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("loader", ["prices", "budgets", "profile", "comm", "spec"])
def test_every_yaml_file_refuses_repeated_keys_and_non_utf8(tmp_path: Path, loader: str) -> None:
    from gpupool.cli.submit_fast import UsageError, _read_file
    from gpupool.prices import load_prices
    from gpupool.profiles.loader import load_profile_file
    from gpupool.sim.budgets import load_budgets
    from gpupool.sim.comm import load_comm_model

    load: dict[str, object] = {"prices": load_prices, "budgets": load_budgets,
                               "profile": lambda p: load_profile_file(Path(p)),
                               "comm": lambda p: load_comm_model(str(p)), "spec": _read_file}
    twice, latin, endless = tmp_path / "twice.yaml", tmp_path / "latin.yaml", tmp_path / "endless.yaml"
    twice.write_text("a: 1\nb: 2\na: 3\n")
    latin.write_bytes("a: caf\u00e9\n".encode("latin-1"))
    endless.write_text("a: &a [1, *a]\n")  # a list that holds itself: a recursion error, once
    for path, said in ((twice, "'a' appears twice"), (latin, "not UTF-8 text"),
                       (endless, "the alias *a refers to the node that holds it")):
        with pytest.raises((InvalidInput, UsageError)) as caught:
            load[loader](str(path))  # type: ignore[operator]
        assert said in str(caught.value), (loader, str(caught.value))


def test_preemption_rules_reach_the_cycle() -> None:
    from gpupool.core.scheduling.reach import PreemptionRules, ReclaimWithinCohort, Scope, WithinQueue

    assert PoolConfig().policies().preemption_rules == PreemptionRules()
    config = parse_config("preemption:\n  scope: pool\n  within_queue: LowerOrNewerEqualPriority\n"
                          "  reclaim_within_cohort: lower-priority\n")
    rules = config.policies().preemption_rules
    assert rules.scope is Scope.POOL and rules.within_queue is WithinQueue.LOWER_OR_NEWER_EQUAL_PRIORITY
    assert rules.reclaim_within_cohort is ReclaimWithinCohort.LOWER_PRIORITY
    assert parse_config(config.to_yaml()) == config


@pytest.mark.parametrize(("text", "expected"), [
    ("preemption:\n  scope: poll\n",
     "p.yaml line 2: preemption.scope: unknown preemption scope 'poll'; choose one of queue, pool. "
     "Did you mean 'pool'?"),
    ("preemption:\n  within_queue: lower_priorty\n",
     "p.yaml line 2: preemption.within_queue: unknown within_queue value 'lower_priorty'; choose one of "
     "never, lower_priority, lower_or_newer_equal_priority. Did you mean 'lower_priority'?"),
    ("preemption:\n  borrow_within_cohort: 1\n",
     "p.yaml line 2: preemption.borrow_within_cohort: borrow_within_cohort value is one of never, "
     "lower_priority, not 1."),
])
def test_an_unknown_preemption_value_is_refused_with_the_valid_ones(text: str, expected: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_config(text, "p.yaml")
    assert caught.value.message == expected


def test_pool_scope_and_a_class_that_is_never_preempted_say_which_wins(tmp_path: Path) -> None:
    text = ("preemption: {scope: pool}\npriority_classes:\n  - {name: steady, value: 0, preemptible: false}\n"
            "  - {name: urgent, value: 100}\n")
    notes = parse_config(text).notes()
    assert notes == ["preemption.scope is pool, but priority class 'steady' is not preemptible: the class "
                     "wins, and its work is never preempted in any queue (set preemptible: true on it to let "
                     "higher classes take it)."]
    assert parse_config(text.replace("scope: pool", "scope: queue")).notes() == []
    path = tmp_path / "pool.yaml"
    path.write_text(text)
    checked = run_cli(["config", "check", str(path)], os.environ)
    assert checked.returncode == 0 and checked.stdout.splitlines() == ["ok", f"note: {notes[0]}"]
