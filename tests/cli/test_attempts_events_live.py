"""Issue 38 item 5 through the real `gpupool` entry point against a real `gpupool up`: every
attempt's log (`logs --attempt N`, `--all-attempts`), the live event stream (`GET /events/stream`,
`gpupool events -f`) with resume and tenant isolation, and `ls --watch`."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from cli_inproc import run_cli
from server.upproc import UpProcess, until

pytestmark = pytest.mark.slow
POD_NETWORK = "10.242.0.0/16"
"""This file's own pod network: pools on one machine must not share one."""
ONCE_THEN_DONE = 'echo "run $GPUPOOL_ATTEMPT"; [ "$GPUPOOL_ATTEMPT" = 1 ] && exec sleep 600; true'
"""Attempt 1 prints and waits to be requeued; attempt 2 prints and succeeds."""


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    server = UpProcess(tmp_path_factory.mktemp("attempts") / "data", ["--simulate", "1x4xH100"],
                       env={"GPUPOOL_POD_NETWORK": POD_NETWORK}).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def rival(pool: UpProcess) -> str:
    """Another tenant's token."""
    assert gp(pool, "tenant", "create", "rival").returncode == 0
    return gp(pool, "token", "create", "--tenant", "rival").stdout.strip()


def gp(pool: UpProcess, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env = {**base, "GPUPOOL_URL": pool.url, "GPUPOOL_TOKEN": token or pool.token()}
    return run_cli(args, env)


def popen(pool: UpProcess, *args: str) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env = {**base, "GPUPOOL_URL": pool.url, "GPUPOOL_TOKEN": pool.token()}
    return subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def submit(pool: UpProcess, *args: str) -> str:
    result = gp(pool, "submit", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def stream(pool: UpProcess, token: str, **params: object) -> list[dict[str, object]]:
    """Every event a finite stream (follow=false) sends."""
    with httpx.Client(base_url=pool.api, headers={"Authorization": f"Bearer {token}"}, timeout=30) as api:
        answer = api.get("/events/stream", params=params)
    assert answer.status_code == 200, answer.text
    return [json.loads(line[5:]) for line in answer.text.splitlines() if line.startswith("data:")]


def admin(pool: UpProcess) -> httpx.Client:
    return httpx.Client(base_url=pool.api, headers={"Authorization": f"Bearer {pool.token()}"}, timeout=30)


class Lines:
    """A process's stdout lines, read by a thread, waited on by condition."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.seen, self._queue = proc, [], queue.Queue[str]()
        assert proc.stdout is not None
        threading.Thread(target=lambda: [self._queue.put(line) for line in proc.stdout or ()],
                         daemon=True).start()

    def until(self, predicate: object, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate(self.seen):  # type: ignore[operator]
            left = deadline - time.monotonic()
            assert left > 0, f"not seen within {timeout_s:g} s: {self.seen}"
            try:
                self.seen.append(self._queue.get(timeout=left))
            except queue.Empty:
                continue


# ---- every attempt's log -------------------------------------------------------------------------

def test_each_attempt_keeps_its_log_and_another_tenant_sees_none(pool: UpProcess, rival: str) -> None:
    wid = submit(pool, "--", "sh", "-c", ONCE_THEN_DONE)
    until(lambda: gp(pool, "logs", wid).stdout.startswith("run 1"), what="attempt 1's output")
    assert gp(pool, "requeue", wid).returncode == 0
    assert gp(pool, "wait", wid).returncode == 0
    assert gp(pool, "logs", wid).stdout == "run 2\n"  # the newest attempt by default
    first = gp(pool, "logs", wid, "--attempt", "1").stdout
    assert first.startswith("run 1\n") and "run 2" not in first
    every = gp(pool, "logs", wid, "--all-attempts").stdout.splitlines()
    assert every[:2] == [f"==> attempt 1 ({wid}-a1-r0) <==", "run 1"]
    assert every[-2:] == [f"==> attempt 2 ({wid}-a2-r0) <==", "run 2"]
    missing = gp(pool, "logs", wid, "--attempt", "3")
    assert (missing.returncode, missing.stderr) == (
        3, f"Error: Workload {wid} has no attempt 3 of replica 0; its attempts so far: 1, 2.\n")
    both = gp(pool, "logs", wid, "--attempt", "1", "--all-attempts")
    assert both.returncode == 2 and "exclude each other" in both.stderr
    for flag in (["--attempt", "1"], ["--attempt", "2"], ["--all-attempts"]):
        refused = gp(pool, "logs", wid, *flag, token=rival)
        assert refused.returncode == 3 and "run" not in refused.stdout + refused.stderr, refused
    with httpx.Client(base_url=pool.api, headers={"Authorization": f"Bearer {rival}"}) as api:
        for query in ({"attempt": 1}, {"attempt": 2}, {"all_attempts": "true"}):
            answer = api.get(f"/workloads/{wid}/logs", params=query)
            assert answer.status_code == 404 and "run" not in answer.text, answer.text
    with pool.client() as api:
        parts = api.get(f"/workloads/{wid}/logs", params={"all_attempts": "true"}).json()["parts"]
    assert [(p["attempt"], p["text"][:6], p["complete"]) for p in parts] == [(1, "run 1\n", True),
                                                                            (2, "run 2\n", True)]


# ---- the event stream ----------------------------------------------------------------------------

def test_a_followed_stream_sees_a_run_in_order_and_a_resume_misses_and_repeats_nothing(
        pool: UpProcess, rival: str) -> None:
    follower = popen(pool, "events", "-f", "-o", "json")  # what is stored, then what follows
    lines = Lines(follower)
    try:
        wid = submit(pool, "--", "true")
        lines.until(lambda seen: any(f'"{wid}"' in s and '"succeeded"' in s for s in seen))
    finally:
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=30) == 0  # Ctrl-C ends a follow with 0
    followed = [json.loads(s) for s in lines.seen if f'"{wid}"' in s]
    assert [e["to_status"] for e in followed] == ["pending", "admitted", "running", "succeeded"]

    stored = stream(pool, pool.token(), workload=wid)
    assert [e["id"] for e in stored] == [e["id"] for e in followed]
    # a client cut off after the second event resumes from its id: the rest, once each
    cut = stored[1]["id"]
    with httpx.Client(base_url=pool.api, headers={"Authorization": f"Bearer {pool.token()}",
                                                  "Last-Event-ID": str(cut)}, timeout=30) as api:
        resumed = api.get("/events/stream", params={"workload": wid}).text
    rest = [json.loads(line[5:]) for line in resumed.splitlines() if line.startswith("data:")]
    assert [e["id"] for e in stored[:2] + rest] == [e["id"] for e in stored]

    printed = gp(pool, "events", wid).stdout.splitlines()  # the CLI's lines, without -f
    assert [line.split()[2:5] for line in printed] == [["-", "->", "pending"], ["pending", "->", "admitted"],
                                                       ["admitted", "->", "running"],
                                                       ["running", "->", "succeeded"]]
    # the other tenant's stream never holds them, and it cannot ask for them
    assert all(e["workload_id"] != wid for e in stream(pool, rival))
    assert gp(pool, "events", wid, token=rival).returncode == 3
    assert gp(pool, "events", "--tenant", "default", token=rival).returncode == 3


def test_a_client_cut_off_mid_stream_resumes_where_it_stopped(pool: UpProcess) -> None:
    first = submit(pool, "--", "true")
    assert gp(pool, "wait", first).returncode == 0
    mine = [e["id"] for e in stream(pool, pool.token())]
    received: list[int] = []
    follow = {"follow": "true", "after": 0}
    with admin(pool) as api, api.stream("GET", "/events/stream", params=follow) as answer:
        for line in answer.iter_lines():
            if line.startswith("id:") and int(line[3:]) > 0:
                received.append(int(line[3:]))
            if len(received) == 3:
                break  # the connection drops here, with events still to come
    second = submit(pool, "--", "true")  # stored while the client was away
    assert gp(pool, "wait", second).returncode == 0
    everything = [e["id"] for e in stream(pool, pool.token())]
    with httpx.Client(base_url=pool.api, headers={"Authorization": f"Bearer {pool.token()}",
                                                  "Last-Event-ID": str(received[-1])}, timeout=30) as api:
        text = api.get("/events/stream").text
    received += [json.loads(line[5:])["id"] for line in text.splitlines() if line.startswith("data:")]
    assert len(received) == len(set(received)) and len(everything) > len(mine)  # nothing twice
    # nothing missed: every event stored before the resume (a later one may follow them)
    later = received[len(everything):]
    assert received[:len(everything)] == everything and all(i > everything[-1] for i in later)


def test_a_bad_resume_id_or_filter_is_a_sentence(pool: UpProcess) -> None:
    with admin(pool) as api:
        bad = api.get("/events/stream", headers={"Last-Event-ID": "yesterday"})
        assert bad.status_code == 422 and "is not an event id" in bad.json()["message"], bad.text
        unknown = api.get("/events/stream", params={"tenant": "nobody"})
        assert unknown.status_code == 404 and "No tenant 'nobody'" in unknown.json()["message"]
    assert gp(pool, "events", "-o", "yaml").returncode == 2


def test_ls_watch_redraws_until_ctrl_c(pool: UpProcess) -> None:
    assert gp(pool, "ls", "--watch", "-o", "json").returncode == 2
    wid = submit(pool, "--", "sleep", "600")
    watcher = popen(pool, "ls", "--watch", "--interval", "0.2", wid)
    lines = Lines(watcher)
    try:
        lines.until(lambda seen: any(wid in s and "running" in s for s in seen))
        assert gp(pool, "cancel", wid).returncode == 0
        lines.until(lambda seen: any(wid in s and "cancelled" in s for s in seen))
    finally:
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=30) == 0
    assert sum(1 for s in lines.seen if s.startswith("--- ")) >= 2  # one view per redraw


def test_streams_end_at_shutdown_and_events_f_resumes_after_a_restart_without_gap_or_repeat(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    server = UpProcess(tmp_path_factory.mktemp("restart") / "data", ["--simulate", "1x1xH100"],
                       env={"GPUPOOL_POD_NETWORK": POD_NETWORK}).start()
    opened, ended = threading.Event(), threading.Event()

    def follow() -> None:
        with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {server.token()}"},
                          timeout=httpx.Timeout(30, read=None)) as api:
            try:
                with api.stream("GET", "/events/stream", params={"follow": "true"}) as answer:
                    if answer.status_code == 200:
                        opened.set()
                    for _ in answer.iter_lines():
                        pass
            except httpx.HTTPError:
                pass
        ended.set()

    follower = popen(server, "events", "-f", "-o", "json", "--reconnect", "120")
    lines = Lines(follower)
    try:
        first = submit(server, "--", "true")
        lines.until(lambda seen: any(f'"{first}"' in s and '"succeeded"' in s for s in seen))
        threading.Thread(target=follow, daemon=True).start()
        # the stream is open before the shutdown (a stream that connected only after it, or never,
        # ended too, and the test passed without a stream to end)
        assert opened.wait(30), "the followed stream opened"
        assert not ended.wait(0.5)  # following (the stream stays open)
        assert server.proc is not None
        proc = server.proc
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)  # uvicorn waits for open responses: a stream that never ended would hold it
        assert ended.wait(10)
        server.start()  # the same data and port: `events -f` reconnects with the last id it received
        second = submit(server, "--", "true")
        lines.until(lambda seen: any(f'"{second}"' in s and '"succeeded"' in s for s in seen), timeout_s=120)
    finally:
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=30) == 0
        server.stop()
    received = [json.loads(s)["id"] for s in lines.seen]
    stored = [e["id"] for e in stream_of(server)]
    assert received == stored[:len(received)] and len(received) >= 8  # both runs, once each, in order


def stream_of(server: UpProcess) -> list[dict[str, object]]:
    """What the stopped server's store holds, read by a server started on it again."""
    server.start()
    try:
        return stream(server, server.token())
    finally:
        server.stop()
