"""What `--help` offers is what the CLI does: an option shown on a group works before its
sub-command too (or is refused), each help line says what its own command does, and the top-level
summaries name every sub-command there is."""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer

from cli_inproc import run_cli
from factories import node
from gpupool.cli._help import reflow
from gpupool.cli.main import COMMANDS, SUBCOMMANDS
from live import LiveServer, live_server
from ports import free_port
from server.fakes import ManualProvider


def clean_env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    return {**base, "GPUPOOL_URL": f"http://127.0.0.1:{free_port()}", "GPUPOOL_TOKEN": "gp_x",
            "COLUMNS": "80", **extra}


def flat(text: str) -> str:
    """Help text as one line: rich's borders and wrapping undone."""
    return " ".join(text.replace("│", " ").split())


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    provider = ManualProvider([node("n0", devices=1)])
    with live_server(tmp_path_factory.mktemp("helptruth"), provider) as server:
        yield server


# ---- options shown on a group ------------------------------------------------------------------------

def test_node_output_given_before_ls_is_used(srv: LiveServer) -> None:
    env = clean_env(GPUPOOL_URL=srv.url, GPUPOOL_TOKEN=srv.admin_token)
    before = run_cli(["node", "-o", "json", "ls"], env)
    assert before.returncode == 0, before.stderr
    assert [n["name"] for n in json.loads(before.stdout)] == ["n0"]
    assert run_cli(["node", "-o", "name", "ls"], env).stdout == "n0\n"
    # given after ls as well: the one after it wins, as it would alone
    assert run_cli(["node", "-o", "json", "ls", "-o", "name"], env).stdout == "n0\n"


def test_a_group_option_its_sub_command_does_not_take_is_refused() -> None:
    refused = run_cli(["node", "-o", "json", "cordon", "n0"], clean_env())
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == "Error: `gpupool node cordon` takes no --output; drop it.\n"


def test_profile_options_given_before_ls_are_used(tmp_path: Path) -> None:
    as_json = run_cli(["profile", "--json", "ls"], clean_env())
    assert as_json.returncode == 0, as_json.stderr
    assert isinstance(json.loads(as_json.stdout), list)
    missing = run_cli(["profile", "--dir", str(tmp_path / "nonexistent"), "ls"], clean_env())
    assert missing.returncode == 2 and "profile directory does not exist" in missing.stderr, missing.stderr


# ---- help texts -----------------------------------------------------------------------------------------

def test_restore_help_says_what_its_passphrase_file_does() -> None:
    shown = run_cli(["restore", "--help"], clean_env(COLUMNS="200"))
    assert shown.returncode == 0
    text = flat(shown.stdout)
    assert "decrypts the backup's secrets.key and admin-token" in text
    assert "go into the backup" not in text  # that is backup's --passphrase-file


def listed(summary: str) -> set[str]:
    """The sub-commands a summary lists after its colon ("Tenants (admin): create, set, ls.")."""
    names = re.sub(r"\([^)]*\)", "", summary.partition(": ")[2]).rstrip(".")
    return {name.strip() for name in re.split(r"[,;]", names) if name.strip()}


def test_each_groups_summary_lists_every_sub_command() -> None:
    for group, (module, attr, summary) in SUBCOMMANDS.items():
        if ": " not in summary:  # a summary in words (fabric) lists none
            continue
        command = typer.main.get_command(getattr(importlib.import_module(module), attr))
        real = set(getattr(command, "commands", {}))
        assert listed(summary) == real, (group, summary, sorted(real))


def test_update_summary_names_what_it_changes() -> None:
    summary = COMMANDS["update"][2]
    for what in ("priority", "time limit", "gpus", "replicas"):
        assert what in summary, what


def test_no_example_runs_into_the_one_before_it() -> None:
    assert reflow("Example: a\nExample: b\nmore of b") == "Example: a\nExample: b more of b"
    shown = run_cli(["submit", "--help"], clean_env())
    assert shown.returncode == 0
    for line in shown.stdout.splitlines():
        assert "Example:" not in line[2:] or line.lstrip(" │").startswith("Example:"), line
