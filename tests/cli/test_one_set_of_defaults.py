"""One set of defaults: `gpupool sim replay` and `sim fill` run, with no flags, what `gpupool up` runs
with no configuration, and neither simulator command keeps a default of its own for a setting the
pool configuration defines."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import gpupool.cli.sim_fill as sim_fill_module
import gpupool.cli.sim_replay as sim_replay_module
from gpupool.cli.sim import app
from gpupool.config import PoolConfig, SchedulingConfig, load_config
from gpupool.core.scheduling.cycle import Policies
from gpupool.core.scheduling.ordering.base import ordering_names
from gpupool.core.scheduling.policies.base import policy_names
from gpupool.server.loops.control import policies as server_policies

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
runner = CliRunner()
REPLAY = ["replay", "--cluster", "2x8xV100M32", "--trace",
          f"philly:{FIXTURES / 'replay' / 'philly_tiny.csv'}"]
FILL = ["fill", "--nodes", str(FIXTURES / "openb" / "nodes.csv"), "--pods",
        str(FIXTURES / "openb" / "pods.csv")]

# the simulator's option -> the configuration's scheduling setting it stands for
SETTINGS = {"policy": "placement", "ordering": "ordering", "preemption": "preemption", "backfill": "backfill"}


def _up_without_config() -> Policies:
    """What `gpupool up` schedules with, given neither --config nor --policy (the server's own code)."""
    rt = SimpleNamespace(config=load_config(None), settings=SimpleNamespace(placement=""))
    return server_policies(rt)  # type: ignore[arg-type]


def _capture(monkeypatch: pytest.MonkeyPatch, module: str, name: str) -> list[Any]:
    """Record the first argument the simulator passes to `module.name`, and stop there."""
    import importlib

    seen: list[Any] = []

    def record(first: Any, *_args: Any, **_kwargs: Any) -> Any:
        seen.append(first)
        raise SystemExit(0)

    monkeypatch.setattr(importlib.import_module(module), name, record)
    return seen


def test_sim_replay_without_flags_runs_what_up_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = _capture(monkeypatch, "gpupool.sim.replay", "replay")
    runner.invoke(app, [*REPLAY, "--json", str(tmp_path / "r.json")])
    assert len(seen) == 1, "the replay never started"
    assert seen[0].policies == _up_without_config()  # every field of the core's Policies


def test_sim_replay_without_flags_reports_the_servers_settings(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = runner.invoke(app, [*REPLAY, "--window", "2017-10-01:2017-10-03", "--seed", "1",
                               "--json", str(out)])
    assert done.exit_code == 0, done.output
    written = json.loads(out.read_text())["config"]
    up = _up_without_config()
    assert {option: written[option] for option in SETTINGS} == {
        option: getattr(up, setting) for option, setting in SETTINGS.items()}


def test_sim_fill_without_policy_runs_what_up_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _capture(monkeypatch, "gpupool.sim.fill", "run_jobs")
    runner.invoke(app, [*FILL, "--seed", "42"])
    assert len(seen) == 1, "the fill never started"
    up = _up_without_config()
    assert [(job.policy, dict(job.options)) for job in seen[0]] == [
        (up.placement, dict(up.placement_options))]


def test_sim_fill_reads_the_configuration_and_flags_win(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    config = tmp_path / "pool.yaml"
    config.write_text("scheduling:\n  placement: fgd\n  placement_options: {coverage: 0.9}\n")
    fill = [*FILL, "--seed", "42", "--config", str(config)]
    seen = _capture(monkeypatch, "gpupool.sim.fill", "run_jobs")
    runner.invoke(app, fill)
    runner.invoke(app, [*fill, "--policy", "best-fit", "--policy", "fgd"])
    assert [[(job.policy, dict(job.options)) for job in work] for work in seen] == [
        [("fgd", {"coverage": 0.9})], [("best-fit", {}), ("fgd", {"coverage": 0.9})]]
    config.write_text("scheduling:\n  placement: fdg\n")
    refused = runner.invoke(app, fill)
    assert refused.exit_code == 2 and "line 2: scheduling.placement" in refused.output
    assert "Traceback" not in refused.output


def test_flags_still_override_the_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = _capture(monkeypatch, "gpupool.sim.replay", "replay")
    runner.invoke(app, [*REPLAY, "--json", str(tmp_path / "r.json"), "--ordering", "priority-fifo",
                        "--policy", "first-fit", "--no-preemption", "--no-backfill"])
    chosen = seen[0].policies
    assert (chosen.ordering, chosen.placement, chosen.preemption, chosen.backfill) == (
        "priority-fifo", "first-fit", False, False)
    assert chosen == PoolConfig().policies(placement="first-fit", ordering="priority-fifo",
                                           preemption=False, backfill=False)


def _options(command: str) -> dict[str, Any]:
    """The command's click parameters by name (typer may carry its own click: read by attribute)."""
    group: Any = typer.main.get_command(app)
    return {p.name: p for p in group.commands[command].params if p.name}


@pytest.mark.parametrize("command", ["replay", "fill"])
def test_no_scheduling_option_has_a_default_of_its_own(command: str) -> None:
    """An option standing for a configuration setting defaults to None ("not given"), so the value
    comes from the configuration; a literal default (`"priority-fifo"`, `False`) fails here."""
    params = _options(command)
    covered = {name for name in params if name in SETTINGS or name in SchedulingConfig.model_fields}
    assert covered >= ({"policy"} if command == "fill" else set(SETTINGS))
    for name in covered:
        default = params[name].default
        assert default in (None, ()), f"sim {command} --{name} defaults to {default!r}"
        help_text = getattr(params[name], "help", "") or ""
        assert f"the configuration's scheduling.{SETTINGS.get(name, name)}" in help_text, name


@pytest.mark.parametrize("module", [sim_replay_module, sim_fill_module])
def test_no_scheduler_name_is_written_into_the_simulator(module: Any) -> None:
    """No placement or ordering name appears as a literal in the simulator's CLI code (docstrings
    aside): a default such as `ordering or "priority-fifo"` would be a second set of defaults."""
    tree = ast.parse(Path(module.__file__).read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    names = set(policy_names()) | set(ordering_names())
    found = [(node.lineno, node.value) for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings]
    assert not found, f"{module.__name__} names a scheduler itself: {found}"


def test_the_help_names_the_configurations_defaults() -> None:
    defaults = PoolConfig().scheduling
    replay = runner.invoke(app, ["replay", "--help"], env={"COLUMNS": "500"}).output
    for setting, shown in (("ordering", defaults.ordering), ("placement", defaults.placement),
                           ("preemption", "on" if defaults.preemption else "off"),
                           ("backfill", "on" if defaults.backfill else "off")):
        assert f"the configuration's scheduling.{setting}, {shown}" in replay, setting
    fill = runner.invoke(app, ["fill", "--help"], env={"COLUMNS": "500"}).output
    assert f"the configuration's scheduling.placement, {defaults.placement}" in fill
