"""Issue 13's conventions through the real `gpupool` entry point: one vocabulary, one sentence per
error (exact exit code, one line on stderr), quiet help with an example everywhere, offline-safe URLs,
and fabric commands a newcomer can navigate."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli_inproc import run_cli
from factories import node
from gpupool.cli import lazy
from gpupool.cli.main import ALIASES, COMMANDS, SUBCOMMANDS, app
from live import LiveServer, live_server
from server.fakes import ManualProvider

ROOT = Path(__file__).resolve().parents[1]
IB = ROOT / "fixtures" / "infiniband"
SMALL_FABRIC = str(IB / "ibsim-net.2sw2path4hca")
BIG_FABRIC = str(IB / "psmn-X5-fattree.topofile")
OPENB = ROOT / "fixtures" / "openb"
runner = CliRunner()


def gpupool(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    return run_cli(args, {**base, **(env or {})})


def one_line_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The one stderr line of a refused command (asserting the exit code and the shape)."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("Error: ") and ".." not in line and "Traceback" not in done.stderr, line
    assert "╭" not in done.stderr and "Usage:" not in done.stderr
    return line


# ---- one sentence per option or argument error ------------------------------------------------------

@pytest.mark.parametrize(("args", "expected"), [
    (["queue", "create", "team-a", "batch", "--quota", "-2"], "Error: --quota must be >= 0 (got -2)."),
    (["submit", "--gpu", "1", "--", "true"],
     "Error: gpupool submit has no option --gpu; did you mean --gpus?"),
    (["up", "--port", "x"], "Error: --port takes a whole number (got x)."),
    (["lss"], "Error: gpupool has no command 'lss'; did you mean 'ls'?"),
    (["tenant", "create"], "Error: gpupool tenant create needs NAME; see gpupool tenant create --help."),
    (["queue", "create", "team-a", "batch", "--quota"], "Error: --quota needs a value."),
])
def test_an_option_error_is_one_sentence(args: list[str], expected: str) -> None:
    assert one_line_error(gpupool(*args), 2) == expected


def test_a_misspelled_option_of_a_lazy_group_gets_a_suggestion() -> None:
    line = one_line_error(gpupool("sim", "fill", "--nodes", "n.csv", "--pods", "p.csv", "--polcy", "x"), 2)
    assert line.endswith("did you mean --policy?")


# ---- one placement option, one default, an unknown name refused everywhere ---------------------------

def test_up_refuses_an_unknown_policy_before_starting(tmp_path: Path) -> None:
    for flag in ("--policy", "--placement"):  # --placement: the hidden old name
        line = one_line_error(gpupool("up", "--data-dir", str(tmp_path / "d"), flag, "fgdd"), 2)
        assert "Unknown placement policy 'fgdd'" in line and "Did you mean 'fgd'?" in line
    assert not (tmp_path / "d").exists()  # refused before anything was made


def test_up_refuses_a_bad_size_limit_before_starting(tmp_path: Path) -> None:
    for flag, said in (("--max-request-body", "--max-request-body must be a size such as"),
                       ("--max-pod-log", "--max-pod-log must be a size such as")):
        line = one_line_error(gpupool("up", "--data-dir", str(tmp_path / "d"), flag, "lots"), 2)
        assert said in line, line
    line = one_line_error(gpupool("up", "--data-dir", str(tmp_path / "d"), "--max-pod-log", "100"), 2)
    assert "at least 4096 bytes" in line
    assert not (tmp_path / "d").exists()


def test_sim_refuses_an_unknown_policy_or_ordering(tmp_path: Path) -> None:
    nodes, pods = str(OPENB / "nodes.csv"), str(OPENB / "pods.csv")
    line = one_line_error(gpupool("sim", "fill", "--nodes", nodes, "--pods", pods, "--policy", "fgdd"), 2)
    assert "Did you mean 'fgd'?" in line
    replay = ["sim", "replay", "--cluster", "1x8xV100M32", "--trace", "philly:x.csv",
              "--json", str(tmp_path / "o.json")]
    assert "Did you mean 'fgd'?" in one_line_error(gpupool(*replay, "--policy", "fgdd"), 2)
    assert "Did you mean 'drf'?" in one_line_error(gpupool(*replay, "--ordering", "drff"), 2)


def test_policy_has_one_name_and_one_default_in_up_and_sim() -> None:
    from gpupool.cli._common import default_policy

    for path in (["up"], ["sim", "fill"], ["sim", "replay"]):
        out = runner.invoke(app, [*path, "--help"], terminal_width=200).output
        assert "--policy" in out and "--placement" not in out, path
        assert default_policy() in out, path
    assert default_policy() == "fgd-strand"  # the pool configuration's default placement
    fill = runner.invoke(app, ["sim", "fill", "--help"], terminal_width=200).output
    replay = runner.invoke(app, ["sim", "replay", "--help"], terminal_width=200).output
    assert "--seed" in fill and "--seed" in replay
    for flag in ("--preemption", "--no-preemption", "--backfill", "--no-backfill", "--exclusive"):
        assert flag in replay


# ---- one vocabulary: every noun has ls, both spellings work -----------------------------------------

def test_every_group_has_ls_and_answers_to_both_spellings() -> None:
    nouns = {"node", "profile", "tenant", "queue", "token", "secret", "image", "service", "server"}
    assert set(ALIASES.values()) == nouns <= set(SUBCOMMANDS)
    for alias, name in ALIASES.items():
        for spelling in (alias, name):
            result = runner.invoke(app, [spelling, "ls", "--help"])
            assert result.exit_code == 0, (spelling, result.output)
    listed = runner.invoke(app, ["--help"], terminal_width=200).output
    assert " node " in listed and " nodes " not in listed  # the alias works but is not listed


def test_profile_ls_lists_models_and_aliases() -> None:
    done = gpupool("profiles", "ls", "--json")
    assert done.returncode == 0, done.stderr
    h100 = next(p for p in json.loads(done.stdout) if p["model"] == "H100-SXM-80GB")
    assert "H100" in h100["aliases"]


def test_sim_help_lists_every_verb() -> None:
    out = runner.invoke(app, ["sim", "--help"], terminal_width=200).output
    assert "fill" in out and "replay" in out


# ---- quieter help -------------------------------------------------------------------------------

def _every_command_path() -> Iterator[list[str]]:
    yield []
    yield from ([name] for name in COMMANDS)
    for name in SUBCOMMANDS:
        yield [name]
        group = lazy._load_group(name)
        for sub, command in getattr(group, "commands", {}).items():
            yield [name, sub]
            yield from ([name, sub, leaf] for leaf in getattr(command, "commands", {}))


def test_help_has_an_example_and_no_type_tags_or_completion_options() -> None:
    paths = list(_every_command_path())
    assert len(paths) > 30
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0, (path, result.output)
        out = result.output
        assert "Example" in out, path
        for noise in ("<str>", "<int>", "<float>", "<bool>", "<path>", "<list", "--install-completion",
                      "--show-completion", "{"):
            assert noise not in out.split("Example")[0], (path, noise)


def test_one_completion_command() -> None:
    done = gpupool("completion", "bash")
    assert done.returncode == 0 and "_GPUPOOL_COMPLETE" in done.stdout
    assert "complete_zsh" in gpupool("completion", "zsh").stdout
    assert "Did you mean 'bash'?" in one_line_error(gpupool("completion", "bsh"), 2)
    asked = {"_GPUPOOL_COMPLETE": "complete_bash", "COMP_WORDS": "gpupool sim fill --po", "COMP_CWORD": "3"}
    done = gpupool(env=asked)  # what the script's shell function runs on TAB
    assert done.returncode == 0 and done.stdout.split() == ["--pods", "--policy"]


# ---- against a live server: English validation, every problem at once, URLs, the token's file ------

@pytest.fixture
def srv(tmp_path: Path) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    provider = ManualProvider([node("n0", devices=4, model="H100")], exit_code=0)
    with live_server(tmp_path / "server", provider) as server:
        env = {"GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.admin_token,
               "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_DATA_HOME": str(tmp_path / "data")}
        yield server, env


def test_a_name_error_speaks_english(srv: tuple[LiveServer, dict[str, str]]) -> None:
    _, env = srv
    line = one_line_error(gpupool("tenant", "create", "Team A", env=env), 2)
    assert "lower-case letters, digits and '-'" in line and "^[" not in line


def test_a_spec_file_with_several_problems_lists_them_all(srv: tuple[LiveServer, dict[str, str]],
                                                        tmp_path: Path) -> None:
    _, env = srv
    spec = tmp_path / "spec.yaml"
    spec.write_text("command: [python, train.py]\nreplicas: 0\npriority: high\nresources: {gpus: lots}\n")
    line = one_line_error(gpupool("submit", "-f", str(spec), env=env), 2)
    assert "3 problems" in line
    for field in ("'replicas' must be >= 1", "'priority' must be a whole number", "'resources.gpus'"):
        assert field in line


def test_a_kubernetes_manifest_gets_unknown_field_apiversion(srv: tuple[LiveServer, dict[str, str]],
                                                            tmp_path: Path) -> None:
    _, env = srv
    spec = tmp_path / "job.yaml"
    spec.write_text("apiVersion: batch/v1\nkind: Job\nmetadata: {name: train}\n"
                    "spec: {template: {spec: {containers: []}}}\n")
    line = one_line_error(gpupool("submit", "-f", str(spec), env=env), 2)
    assert line.startswith("Error: 5 problems: unknown field 'apiVersion'; ") and "Kubernetes" in line
    assert "field 'command' is required" in line  # the file's problems all at once, not one local refusal


def test_a_url_with_api_v1_or_without_a_scheme(srv: tuple[LiveServer, dict[str, str]]) -> None:
    server, env = srv
    for url in (f"{server.url}/api/v1", f"{server.url}/api/v1/", server.url.removeprefix("http://")):
        done = gpupool("tenant", "ls", env={**env, "GPUPOOL_URL": url})
        assert done.returncode == 0, (url, done.stderr)
    line = one_line_error(gpupool("tenant", "ls", env={**env, "GPUPOOL_URL": "pool.example:8765"}), 2)
    assert "no scheme" in line and "https://pool.example:8765" in line


def test_an_auth_error_names_the_file_the_token_came_from(srv: tuple[LiveServer, dict[str, str]],
                                                         tmp_path: Path) -> None:
    server, env = srv
    config = tmp_path / "config" / "gpupool" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'url = "{server.url}"\ntoken = "gp_not_a_real_token"\n')
    env = {k: v for k, v in env.items() if k not in ("GPUPOOL_TOKEN", "GPUPOOL_URL")}
    for args in (["tenant", "ls"], ["submit", "--", "true"]):
        line = one_line_error(gpupool(*args, env=env), 3)
        assert str(config) in line, line


# ---- fabric commands a newcomer can navigate -----------------------------------------------------------

def test_fabric_show_lists_ca_and_switch_names() -> None:
    done = gpupool("fabric", "show", SMALL_FABRIC, "--cas", "--switches", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert [ca["name"] for ca in listed["cas"]] == ["Hca1", "Hca2", "Hca3", "Hca4"]
    assert [sw["name"] for sw in listed["switches"]] == ["Switch1", "Switch2"]
    table = gpupool("fabric", "show", SMALL_FABRIC, "--cas")
    assert table.returncode == 0 and "Hca3" in table.stdout and "Switch1" in table.stdout


def test_fabric_route_to_itself_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    line = one_line_error(gpupool("fabric", "route", SMALL_FABRIC, "Hca1", "Hca1"), 2)
    assert "same CA" in line
    line = one_line_error(gpupool("fabric", "show", str(tmp_path / "nope.topo")), 2)
    assert "no such file" in line.lower() and "nope.topo" in line


def test_fabric_draw_names_switches_and_hosts_and_has_a_legend(tmp_path: Path) -> None:
    small, big = tmp_path / "small.svg", tmp_path / "big.svg"
    assert gpupool("fabric", "draw", SMALL_FABRIC, "--out", str(small)).returncode == 0
    text = small.read_text()
    for word in ("Switch1", "Switch2", "Hca1", "Hca4", "switch", "host (CA)", "link"):
        assert f">{word}</text>" in text, word
    assert gpupool("fabric", "draw", BIG_FABRIC, "--out", str(big)).returncode == 0
    text = big.read_text()  # 89 hosts: counted per leaf instead of named one by one
    assert "24 hosts" in text and "degraded link" in text and "H-0002c90300048208" not in text


def test_an_error_sentence_has_one_line_and_one_full_stop() -> None:
    from gpupool.cli._usage import sentence

    assert sentence("Cannot read x..") == "Cannot read x."
    assert sentence("No node n1.\nSee --help") == "No node n1. See --help."
    assert sentence("Did you mean 'fgd'?") == "Did you mean 'fgd'?"
