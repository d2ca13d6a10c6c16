"""The server refuses a field (`Field 'quota_gpus' must be <= 1e+06`); the CLI says it of the option the
user typed (`--quota must be <= 1e+06`), never of the API's field name. A --since or --until that
reaches back before 1970 is said in the user's terms before anything is sent."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from cli.cliproc import gpupool, one_line_error
from factories import node
from live import LiveServer, live_server
from server.fakes import ManualProvider

FIELD_NAMES = ("Field", "field '", "_gpus", "_s'", "max_priority", "max_pending")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("flags"), ManualProvider([node("n0", devices=8)])) as server:
        yield server


@pytest.fixture(scope="module")
def workload(srv: LiveServer) -> str:
    done = gpupool(srv.url, srv.admin_token, "submit", "--gpus", "1", "--", "true")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def said(done: subprocess.CompletedProcess[str], sentence: str) -> None:
    line = one_line_error(done, 2, "Error: ")
    assert line == f"Error: {sentence}"
    assert not any(name in line for name in FIELD_NAMES), line


@pytest.mark.parametrize(("args", "sentence"), [
    (("queue", "create", "default", "q1", "--quota", "1e12"),
     "--quota must be <= 1e+06 (got 1000000000000.0)."),
    (("queue", "create", "default", "q1", "--quota", "1e9", "--borrowing-limit", "1e12"),
     "2 problems: --quota must be <= 1e+06 (got 1000000000.0); --borrowing-limit must be <= 1e+06 (got "
     "1000000000000.0)."),
    (("queue", "set", "default", "default", "--lending-limit", "1e9"),
     "--lending-limit must be <= 1e+06 (got 1000000000.0)."),
    (("tenant", "create", "team-x", "--max-priority", "99999999"),
     "--max-priority must be <= 1000 (got 99999999)."),
    (("tenant", "set", "default", "--max-pending", "99999999999"),
     "--max-pending must be <= 10000000 (got 99999999999)."),
], ids=["queue-quota", "queue-two", "queue-set-lending", "tenant-create", "tenant-set"])
def test_a_refused_field_is_named_as_its_option(srv: LiveServer, args: tuple[str, ...],
                                                sentence: str) -> None:
    said(gpupool(srv.url, srv.admin_token, *args), sentence)


@pytest.mark.parametrize(("args", "flag"), [
    (("ls", "--since", "6000-01-01"), "--since"),
    (("audit", "--since", "6000-01-01"), "--since"),
    (("usage", "--until", "6000-01-01"), "--until"),
], ids=["ls", "audit", "usage-until"])
def test_a_time_past_the_apis_bound_is_said_of_the_option(srv: LiveServer, args: tuple[str, ...],
                                                          flag: str) -> None:
    done = gpupool(srv.url, srv.admin_token, *args)
    line = one_line_error(done, 2, f"Error: {flag} must be <= 1e+11 (got ")
    assert not any(name in line for name in FIELD_NAMES), line


def test_logs_and_update_name_their_options(srv: LiveServer, workload: str) -> None:
    said(gpupool(srv.url, srv.admin_token, "logs", workload, "--rank", "99999999999"),
         "--rank must be <= 100000 (got '99999999999').")
    said(gpupool(srv.url, srv.admin_token, "update", workload, "--gpus", "1e9", "--replicas", "1000000000"),
         "2 problems: --gpus must be <= 1024 (got 1000000000.0); --replicas must be <= 256 (got 1000000000).")


@pytest.mark.parametrize(("args", "flag", "given"), [
    (("ls", "--since", "99999999999d"), "--since", "99999999999d"),
    (("ls", "--since", "1900-01-01"), "--since", "1900-01-01"),
    (("audit", "--since", "1900-01-01"), "--since", "1900-01-01"),
    (("usage", "--since", "99999999999d"), "--since", "99999999999d"),
    (("usage", "--until", "1900-01-01"), "--until", "1900-01-01"),
], ids=["ls-span", "ls-date", "audit", "usage-since", "usage-until"])
def test_a_time_before_1970_is_said_of_the_option(srv: LiveServer, args: tuple[str, ...], flag: str,
                                                  given: str) -> None:
    said(gpupool(srv.url, srv.admin_token, *args),
         f"{flag} {given!r} reaches back before 1970-01-01; give a shorter span or a later date.")


def test_exec_rank_past_any_gang_is_said_of_rank(srv: LiveServer, workload: str) -> None:
    said(gpupool(srv.url, srv.admin_token, "exec", workload, "--rank", "99999999999", "--", "true"),
         "--rank takes a replica number (0, 1, ... up to 2147483647), not '99999999999'.")


def test_an_empty_program_is_said_of_the_command_typed(srv: LiveServer) -> None:
    """It read "Field 'command' the first word of the command (the program) must not be empty"."""
    done = gpupool(srv.url, srv.admin_token, "submit", "--", "", "x")
    said(done, "the command after -- must start with the program to run; its first word is empty.")
