"""Cases where the CLI used to say too little or the wrong thing: a token lifetime past the API's
bound (said in the API's field name and seconds), `logs` of a workload with no pod started yet
(silence), and `top` ended with Ctrl-C (exit 130, where `ls --watch` and `events -f` exit 0)."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from cli_inproc import run_cli
from factories import node
from gpupool.client import Client
from live import LiveServer, live_server
from ports import free_port
from server.fakes import ManualProvider


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("quiet"), ManualProvider([node("n0", devices=1)])) as server:
        yield server


def env_for(srv: LiveServer | None = None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    if srv is None:  # nothing answers there: what is refused is refused before anything is sent
        return {**base, "GPUPOOL_URL": f"http://127.0.0.1:{free_port()}", "GPUPOOL_TOKEN": "gp_x"}
    return {**base, "GPUPOOL_URL": srv.url, "GPUPOOL_TOKEN": srv.admin_token}


# ---- token create --expires -----------------------------------------------------------------------------

def test_a_token_lifetime_past_the_bound_is_refused_in_the_users_terms() -> None:
    from gpupool.cli.token import max_lifetime_s

    assert max_lifetime_s() == 100 * 365 * 86400  # what the API takes (TokenCreate.expires_in_s)
    refused = run_cli(["token", "create", "--admin", "--expires", "100000d"], env_for())
    assert (refused.returncode, refused.stdout) == (2, "")
    assert "--expires takes at most 100 years (36500d), got '100000d'" in refused.stderr, refused.stderr
    assert "expires_in_s" not in refused.stderr and "Cannot reach" not in refused.stderr


def test_the_longest_lifetime_is_still_taken(srv: LiveServer) -> None:
    made = run_cli(["token", "create", "--admin", "--name", "century", "--expires", "36500d"], env_for(srv))
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("gp_")


# ---- logs of a workload that has not started --------------------------------------------------------------

def test_logs_of_a_workload_not_started_says_so_on_stderr(srv: LiveServer) -> None:
    env = env_for(srv)
    with Client(srv.url, srv.admin_token) as admin:
        first = admin.submit(command=["sleep", "600"], gpus=1)
        waiting = admin.submit(command=["true"], dependency=f"afterok:{first}")
        try:
            shown = run_cli(["logs", waiting], env)
            assert (shown.returncode, shown.stdout) == (0, "")
            assert shown.stderr.startswith(f"gpupool: {waiting} has not started yet (pending: "
                                           "waiting_for_dependency: "), shown.stderr
            assert shown.stderr.endswith(f"); its output shows once it runs (`gpupool logs {waiting} -f`).\n")
            assert len(shown.stderr.splitlines()) == 1
            admin.cancel(waiting)
            ended = run_cli(["logs", waiting], env)
            assert (ended.returncode, ended.stdout) == (0, "")
            assert ended.stderr.startswith(f"gpupool: {waiting} ended before any pod of it started "
                                           "(cancelled"), ended.stderr
        finally:
            admin.cancel(first)


# ---- top and Ctrl-C -------------------------------------------------------------------------------------

def test_top_ended_with_ctrl_c_exits_0(srv: LiveServer) -> None:
    main, child = pty.openpty()  # a terminal: the live view draws at once, so it shows it is running
    top = subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", "top", "--interval", "0.2"],
                           env=env_for(srv), stdin=subprocess.DEVNULL, stdout=child, stderr=child)
    os.close(child)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"workloads:" not in seen:
            assert time.monotonic() < deadline and top.poll() is None, seen
            if select.select([main], [], [], 0.5)[0]:
                seen += os.read(main, 65536)
        top.send_signal(signal.SIGINT)
        code = top.wait(timeout=30)
    finally:
        if top.poll() is None:
            top.kill()
        os.close(main)
    assert code == 0, seen[-2000:]
