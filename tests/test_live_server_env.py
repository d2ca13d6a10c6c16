"""tests/live.py refuses a variable added to the C environment while its server's thread runs (glibc
may free the environment's array under that thread's getenv), and `cli_env` sets the CLI's before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from factories import node
from live import cli_env, live_server
from server.fakes import ManualProvider

NEW = "GPUPOOL_TEST_ADDED_WHILE_SERVING"


def test_a_variable_added_while_the_server_serves_is_refused(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NEW, raising=False)
    with live_server(tmp_path, ManualProvider([node("n0", devices=1)]),
                     before_serving=cli_env(monkeypatch, COLUMNS="200")) as server:
        assert os.environ["GPUPOOL_URL"] == server.url
        assert os.environ["COLUMNS"] == "200"
        with pytest.raises(AssertionError, match="before the thread starts"):
            os.environ[NEW] = "x"
        assert NEW not in os.environ
        monkeypatch.setenv("GPUPOOL_TOKEN", "gp_other")  # one that exists: only its value changes
    monkeypatch.setenv(NEW, "x")  # the thread is gone: allowed again
    assert os.environ[NEW] == "x"
