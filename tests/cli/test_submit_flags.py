"""Issue 12 items 1, 4, 5 and 6 through the real `gpupool` entry point against a live server:
submit --priority-class, --time-limit, --max-retries and --array, and ls / wait / cancel / show on an
array's id."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cli.cliproc import gpupool, one_line_error
from factories import ISSUE_CONFIG, node
from gpupool.api.workloads import WorkloadOut
from gpupool.cli.submit_fast import UsageError, duration_s, parse
from gpupool.client import Client
from gpupool.config import parse_config
from gpupool.server.orm import WorkloadRow
from live import LiveServer, live_server
from server.fakes import ManualProvider


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, ManualProvider]]:
    provider = ManualProvider([node("n0", devices=1, model="H100-SXM-80GB", device_memory_mib=81920)])
    with live_server(tmp_path_factory.mktemp("flags"), provider) as server:
        yield server, provider


@pytest.fixture(scope="module")
def srv(pool: tuple[LiveServer, ManualProvider]) -> LiveServer:
    return pool[0]


@pytest.fixture(scope="module")
def team_token(srv: LiveServer) -> str:
    with Client(srv.url, srv.admin_token) as api:
        api.create_tenant("team-a")  # max_priority 0
        return api.create_token("team-a").token


def gp(srv: LiveServer, *args: str, token: str = "") -> subprocess.CompletedProcess[str]:
    return gpupool(srv.url, token or srv.admin_token, *args)


def submitted(srv: LiveServer, *args: str, token: str = "") -> WorkloadOut:
    """Submit `args` (then `-- true`); returns the workload as the server stored it."""
    result = gp(srv, "submit", *args, "--", "true", token=token)
    assert result.returncode == 0, result.stderr
    with Client(srv.url, srv.admin_token) as api:
        return api.workload(result.stdout.strip())


def until(predicate: Callable[[], bool], srv: LiveServer, what: str) -> None:
    deadline = time.monotonic() + 60
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        srv.rt.wake.set()
        time.sleep(0.02)


def test_help_teaches_each_flag(srv: LiveServer) -> None:
    result = gp(srv, "submit", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.replace("│", " ").split())  # a wrapped cell continues past the border
    for taught in ("--priority-class", "config show", "--time-limit", "1:30:00", "bare number",
                   "--max-retries", "failure.max_retries", "--array", "0-999%50", "GPUPOOL_ARRAY_INDEX",
                   "10000 tasks"):
        assert taught in text, taught


# ---- priority classes ------------------------------------------------------------------------------

def test_priority_class_ranks_and_priority_orders_within_it(srv: LiveServer) -> None:
    picked = submitted(srv, "--priority-class", "high", "--priority", "5")
    assert (picked.spec.priority_class, picked.priority) == ("high", 5)
    assert submitted(srv).spec.priority_class == "normal"  # stored resolved, as the default


def test_the_issues_configuration_defaults_to_its_lowest_non_negative_class(srv: LiveServer) -> None:
    before = srv.rt.config
    srv.rt.config = parse_config(ISSUE_CONFIG)
    try:
        assert submitted(srv).spec.priority_class == "low"
        assert submitted(srv, "--priority-class", "high").spec.priority_class == "high"
        line = one_line_error(gp(srv, "submit", "--priority-class", "normal", "--", "true"), 2, "Error: ")
        assert "Unknown priority class 'normal'; choose one of low, high" in line
    finally:
        srv.rt.config = before


def test_an_unknown_class_is_one_sentence_with_a_suggestion(srv: LiveServer) -> None:
    line = one_line_error(gp(srv, "submit", "--priority-class", "hihg", "--", "true"), 2,
                          "Error: Unknown priority class 'hihg'; choose one of critical, high, normal, "
                          "best-effort")
    assert line.endswith("Did you mean 'high'?")


def test_a_tenants_max_priority_bounds_its_class(srv: LiveServer, team_token: str) -> None:
    one_line_error(gp(srv, "submit", "--priority-class", "high", "--", "true", token=team_token), 2,
                   "Error: Tenant team-a may not use priority class high (value 100): its max priority is 0")
    assert submitted(srv, "--priority-class", "best-effort", token=team_token).tenant == "team-a"
    assert submitted(srv, token=team_token).spec.priority_class == "normal"
    assert submitted(srv, "--priority-class", "critical").spec.priority_class == "critical"  # the admin


# ---- time limits and retries -------------------------------------------------------------------------

@pytest.mark.parametrize(("given", "seconds"), [
    ("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("1:30:00", 5400), ("10:00", 600),
    ("2-12", 216000), ("1-00:00:30", 86430), ("1.5h", 5400),
])
def test_time_limit_forms(given: str, seconds: float) -> None:
    assert duration_s(given) == seconds


def test_time_limit_is_stored_in_the_spec_and_its_column(srv: LiveServer) -> None:
    limited = submitted(srv, "--time-limit", "1:30:00")
    assert limited.spec.time_limit_s == 5400
    with srv.rt.store.read() as session:
        row = session.get(WorkloadRow, limited.id)
        assert row is not None and row.time_limit_s == 5400
    assert submitted(srv).spec.time_limit_s is None


@pytest.mark.parametrize(("args", "starts"), [
    (("--time-limit", "90"), "Error: Option --time-limit takes a duration such as 90s, 30m"),
    (("--time-limit", "soon"), "Error: Option --time-limit takes a duration"),
    (("--time-limit", "0s"), "Error: Option --time-limit takes from 1s to 366d, got '0s'."),
    (("--time-limit", "400d"), "Error: Option --time-limit takes from 1s to 366d, got '400d'."),
    (("--checkpoint-every", "0s"), "Error: Option --checkpoint-every takes from 1s to 366d, got '0s'."),
    (("--checkpoint-every", "often"), "Error: Option --checkpoint-every takes a duration"),
    (("--max-retries", "1001"), "Error: Option --max-retries takes from 0 to 1000, got '1001'."),
    (("--max-retries", "-1"), "Error: Option --max-retries takes from 0 to 1000, got '-1'."),
    (("--max-retries", "many"), "Error: Option --max-retries takes a whole number"),
])
def test_bad_limits_are_one_line(srv: LiveServer, args: tuple[str, ...], starts: str) -> None:
    one_line_error(gp(srv, "submit", *args, "--", "true"), 2, starts)


def test_checkpoint_every_is_stored_in_the_spec(srv: LiveServer) -> None:
    assert submitted(srv, "--checkpoint-every", "30m").spec.checkpoint_interval_s == 1800
    assert submitted(srv).spec.checkpoint_interval_s is None


def test_max_retries_is_stored_in_the_spec(srv: LiveServer) -> None:
    assert submitted(srv, "--max-retries", "5").spec.max_retries == 5
    assert submitted(srv, "--max-retries", "0").spec.max_retries == 0
    assert submitted(srv).spec.max_retries is None  # the loop applies the config's failure.max_retries


def test_the_api_bounds_what_the_sdk_sends(srv: LiveServer) -> None:
    from gpupool.errors import InvalidInput

    with Client(srv.url, srv.admin_token) as api, pytest.raises(InvalidInput, match="max_retries"):
        api.submit({"command": ["true"], "max_retries": 1001})
    with Client(srv.url, srv.admin_token) as api, pytest.raises(InvalidInput, match="time_limit_s"):
        api.submit({"command": ["true"], "time_limit_s": 0})


def test_new_flags_in_the_parsed_spec() -> None:
    spec = parse(["--priority-class", "high", "--time-limit", "2h", "--max-retries", "3", "-a", "0-9%2",
                  "--", "python", "x.py"])
    assert {k: spec[k] for k in ("priority_class", "time_limit_s", "max_retries", "array")} == {
        "priority_class": "high", "time_limit_s": 7200.0, "max_retries": 3, "array": "0-9%2"}
    with pytest.raises(UsageError, match="did you mean --time-limit"):
        parse(["--time-limt", "2h", "--", "x"])


# ---- arrays ------------------------------------------------------------------------------------------

def _task_ids(srv: LiveServer, array_id: str) -> list[str]:
    with Client(srv.url, srv.admin_token) as api:
        return api.workload_ids(array_id=array_id)


def _statuses(srv: LiveServer, array_id: str) -> list[str]:
    with Client(srv.url, srv.admin_token) as api:
        return [w.status for w in api.workloads(array_id=array_id).items]


def test_an_array_from_submit_to_wait(pool: tuple[LiveServer, ManualProvider]) -> None:
    srv, provider = pool
    result = gp(srv, "submit", "--array", "0-3%1", "--gpus", "1", "--", "python", "sweep.py")
    assert result.returncode == 0, result.stderr
    array_id = result.stdout.strip()
    assert array_id.startswith("w-") and "_" not in array_id and "\n" not in array_id
    tasks = [f"{array_id}_{i}" for i in range(4)]
    assert _task_ids(srv, array_id) == tasks  # index order
    until(lambda: _statuses(srv, array_id)[0] == "running", srv, "task 0 runs")

    table = gp(srv, "ls", array_id)
    assert table.returncode == 0, table.stderr
    assert f"{array_id}_[1-3%1]" in table.stdout and f"{tasks[0]} " in table.stdout  # folded, like squeue
    assert f"{tasks[1]} " not in table.stdout
    assert f"{array_id}_[1-3%1]" in gp(srv, "ls").stdout  # the whole listing folds too
    expanded = gp(srv, "ls", array_id, "--expand").stdout
    assert all(f"{t} " in expanded for t in tasks)
    assert gp(srv, "ls", array_id, "-o", "name").stdout.split() == tasks
    assert gp(srv, "ls", array_id[:8], "-o", "name").stdout.split() == tasks  # a unique prefix
    one_line_error(gp(srv, "show", array_id), 2, f"Error: {array_id} is an array of 4 tasks; name one task "
                   f"(e.g. {tasks[0]})")

    def finish_what_runs() -> bool:
        for pod_id in provider.running():
            if pod_id.startswith(array_id):
                provider.finish(pod_id, 0)
        return _statuses(srv, array_id) == ["succeeded"] * 4

    until(finish_what_runs, srv, "every task succeeds")
    waited = gp(srv, "wait", array_id)
    assert (waited.returncode, waited.stdout) == (0, f"{array_id} array of 4 tasks: 4 succeeded\n")
    one_line_error(gp(srv, "cancel", array_id), 2, f"Error: Array {array_id} already finished (all 4 tasks)")


def test_cancel_and_wait_on_an_array(srv: LiveServer) -> None:
    array_id = gp(srv, "submit", "--array", "0-2", "--gpus", "1", "--", "true").stdout.strip()
    cancelled = gp(srv, "cancel", array_id)
    assert (cancelled.returncode, cancelled.stdout) == (0, f"{array_id} array: cancelled 3 tasks\n")
    assert _statuses(srv, array_id) == ["cancelled"] * 3
    waited = gp(srv, "wait", array_id)
    assert waited.returncode == 1
    assert waited.stdout.startswith(f"{array_id} array of 3 tasks: 3 cancelled (first: {array_id}_")


def test_an_array_too_large_is_refused_with_the_cap(srv: LiveServer) -> None:
    one_line_error(gp(srv, "submit", "--array", "0-10000", "--", "true"), 2, "Error: ")
    line = gp(srv, "submit", "--array", "0-10000", "--", "true").stderr
    assert "names 10001 tasks, but one array holds at most 10000; split the sweep" in line


def test_the_sdk_submits_lists_and_cancels_an_array(srv: LiveServer, tmp_path: Path) -> None:
    with Client(srv.url, srv.admin_token) as api:
        array_id = api.submit({"command": ["true"], "array": "5,7", "resources": {"gpus": 1}})
        assert api.workload_ids(array_id=array_id) == [f"{array_id}_5", f"{array_id}_7"]
        assert api.cancel_array(array_id).cancelled == 2
        assert [w.status for w in api.wait_array(array_id, timeout_s=30)] == ["cancelled", "cancelled"]
