"""HAProxy as the pool runs it: replicas change at runtime without a reload, a removed replica is drained
first, health checks follow the readiness probe, and a dead HAProxy is restarted with its state."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dataplane_replicas import digest, get, replicas
from test_dataplane import wait_for

from gpupool.server.dataplane.haproxy import HAProxySupervisor, find_haproxy
from gpupool.server.dataplane.model import Backend, Probe, Route
from gpupool.server.dataplane.plane import DataPlane
from ports import free_port

HAPROXY = find_haproxy()
pytestmark = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed "
                                "(scripts/install-test-deps.sh installs it)")
PROBE = Probe(path="/ready", interval_s=0.2, success_threshold=1, failure_threshold=2)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataPlane]:
    assert HAPROXY is not None
    dp = DataPlane(tmp_path_factory.mktemp("hap") / "dataplane", "127.0.0.1", free_port(),
                   cold_start_limit_s=20.0, haproxy=HAPROXY)
    os.environ["GPUPOOL_TEST_SECRET"] = "must-not-leak"  # as the server's own settings would be
    try:
        dp.start()
    finally:
        del os.environ["GPUPOOL_TEST_SECRET"]
    dp.set_tokens({digest("gp_alice"): "alice"})
    try:
        yield dp
    finally:
        dp.stop()


def sup(plane: DataPlane) -> HAProxySupervisor:
    assert plane.haproxy is not None
    return plane.haproxy


def worker_pid(plane: DataPlane) -> str:
    info = sup(plane).runtime.command("show info").splitlines()
    return next(line for line in info if line.startswith("Pid:"))


def server_states(plane: DataPlane, backend: str) -> dict[str, str]:
    """server name -> srv_op_state (2 up, 0 down) from `show servers state`."""
    rows = sup(plane).runtime.command(f"show servers state {backend}").splitlines()[2:]
    return {cols[3]: cols[5] for cols in (row.split() for row in rows) if len(cols) > 5}


DRAIN = 0x08
"""SRV_ADMF_FDRAIN in `show servers state`'s srv_admin_state: set by `set server ... state drain`."""


def server_admin(plane: DataPlane, backend: str) -> dict[str, int]:
    """server name -> srv_admin_state (a bit field) from `show servers state`."""
    rows = sup(plane).runtime.command(f"show servers state {backend}").splitlines()[2:]
    return {cols[3]: int(cols[6]) for cols in (row.split() for row in rows) if len(cols) > 6}


def test_replicas_are_added_drained_and_removed_without_a_reload(plane: DataPlane) -> None:
    plane.set_routes([Route("alice/rt", "alice", probe=PROBE)])
    master, worker = sup(plane).master_pid, worker_pid(plane)
    with replicas("a", "b") as (a, b):
        plane.set_backends("alice/rt", [Backend("rt-a", "127.0.0.1", a.port)])
        assert get(plane.port, "/s/alice/rt/x", "gp_alice").text.startswith("a ")
        a.release.clear()
        slow: list[str] = []
        request = threading.Thread(
            target=lambda: slow.append(get(plane.port, "/s/alice/rt/slow", "gp_alice").text))
        request.start()
        wait_for("the slow request at a", lambda: "/slow" in a.seen)
        swap = threading.Thread(target=plane.set_backends,
                                args=("alice/rt", [Backend("rt-b", "127.0.0.1", b.port)]))
        swap.start()  # adds b, drains a: it returns once a's request is answered
        # b is added, then a set to drain (two commands): requests go to b alone once a drains
        wait_for("b added and a draining", lambda: "r-rt-b" in server_states(plane, "svc_alice.rt")
                 and server_admin(plane, "svc_alice.rt").get("r-rt-a", 0) & DRAIN)
        answered = [get(plane.port, f"/s/alice/rt/n{i}", "gp_alice").text.split()[0] for i in range(4)]
        assert answered == ["b"] * 4
        assert swap.is_alive()  # still waiting for a's request in flight
        a.release.set()
        swap.join(timeout=30)
        request.join(timeout=30)
        assert slow == ["a /slow -"]  # the drained replica finished its request
        assert set(server_states(plane, "svc_alice.rt")) == {"activator", "r-rt-b"}
    assert (sup(plane).master_pid, worker_pid(plane)) == (master, worker)  # no restart, no reload


def test_health_checks_repeat_the_readiness_probe(plane: DataPlane) -> None:
    plane.set_routes([Route("alice/hc", "alice", probe=PROBE)])
    config = sup(plane).paths.config.read_text()
    assert "option httpchk GET /ready" in config
    with replicas("a") as (a,):
        plane.set_backends("alice/hc", [Backend("hc-a", "127.0.0.1", a.port)])
        assert "check inter 200 rise 1 fall 2" in sup(plane).paths.config.read_text()
        a.ready.clear()
        state = lambda: server_states(plane, "svc_alice.hc")["r-hc-a"]  # noqa: E731
        wait_for("HAProxy to see the probe fail", lambda: state() == "0")
        a.ready.set()
        wait_for("HAProxy to see it pass again", lambda: state() == "2")


def test_haproxy_runs_without_the_servers_environment(plane: DataPlane) -> None:
    raw = Path(f"/proc/{sup(plane).master_pid}/environ").read_bytes()
    environ = [e.decode() for e in raw.split(b"\0") if e]
    assert "PATH=/usr/sbin:/usr/bin:/sbin:/bin" in environ
    # only what HAProxy's master sets for its workers besides the PATH given
    assert [e for e in environ if not e.startswith(("PATH=", "HAPROXY_"))] == []


def test_a_killed_haproxy_is_restarted_with_its_services_replicas_and_tokens(plane: DataPlane) -> None:
    plane.set_routes([Route("alice/phoenix", "alice", probe=PROBE)])
    with replicas("a") as (a,):
        plane.set_backends("alice/phoenix", [Backend("ph-a", "127.0.0.1", a.port)])
        old = sup(plane).master_pid
        assert old is not None
        restarts = sup(plane).restarts
        os.kill(old, signal.SIGKILL)
        wait_for("a new HAProxy", lambda: sup(plane).restarts == restarts + 1)
        assert sup(plane).master_pid != old
        wait_for("the new one to route",
                 lambda: get(plane.port, "/s/alice/phoenix/x", "gp_alice").status_code == 200)
        assert get(plane.port, "/s/alice/phoenix/x", "gp_alice").text.startswith("a /x")
        assert get(plane.port, "/s/alice/phoenix/x", "gp_forged").status_code == 401


def running(pid: int, start_ticks: int | None) -> bool:
    """Alive, not a zombie waiting to be reaped (this test's own child), and the same process: once
    reaped its pid may already be another's (pid_max is 32,768 here, and the suite starts many)."""
    from gpupool.agent.podstate import process_alive

    return process_alive(pid, start_ticks)


def test_a_haproxy_left_by_a_killed_pool_is_stopped_by_the_next_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert HAPROXY is not None
    port = free_port()
    first = HAProxySupervisor(HAPROXY, tmp_path / "dataplane", "127.0.0.1", port, 5.0)
    first.start()
    orphan = first.master_pid
    assert orphan is not None
    from gpupool.agent.podstate import process_start_ticks

    orphan_started = process_start_ticks(orphan)
    first._stopping.set()  # the pool is gone without stopping it (kill -9): its HAProxy keeps the port
    second = HAProxySupervisor(HAPROXY, tmp_path / "dataplane", "127.0.0.1", port, 5.0)
    try:
        with caplog.at_level(logging.WARNING, logger="gpupool"):
            second.start()
        assert second.master_pid != orphan
        # signalled by the start (SIGTERM, then SIGKILL if it lingers): its end may take the kernel
        # a moment more on a loaded machine (a full run once saw it still there right after)
        deadline = time.monotonic() + 10
        while running(orphan, orphan_started) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(orphan, orphan_started), (caplog.text, Path(f"/proc/{orphan}/stat").read_text())
        assert get(port, "/s/alice/none/", "gp_alice").status_code == 404  # the new one answers
    finally:
        second.stop()
        first.stop()


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="HAProxy's workers change account only where the "
                             "pool runs as root (run the tests as root)")


def workers(plane: DataPlane) -> list[int]:
    """The master's children: HAProxy's workers (the processes that parse requests)."""
    master = sup(plane).master_pid
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        if f"\nPPid:\t{master}\n" in text:
            found.append(int(status.parent.name))
    return found


def ids(pid: int) -> tuple[set[int], set[int], set[int]]:
    """(the uids, the gids, the supplementary groups) of a process: real, effective, saved, fs."""
    lines = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                 if ":" in line)
    return ({int(u) for u in lines["Uid"].split()}, {int(g) for g in lines["Gid"].split()},
            {int(g) for g in lines["Groups"].split()})


@as_root
def test_haproxys_workers_run_as_an_account_of_their_own_in_a_jail(plane: DataPlane) -> None:
    from gpupool.agent.identity import ROUTER_ACCOUNT, router_account

    account = router_account()
    assert account is not None and account.user == ROUTER_ACCOUNT
    jail = sup(plane).jail
    assert jail is not None and (jail.uid, jail.gid) == (account.uid, account.gid)

    def unjailed() -> list[str] | None:
        """What is wrong with each worker now; None while there is none. A worker just forked (at a
        reload) is root until it drops to the account, and an old one may exit while it is read."""
        read, wrong = 0, []
        for pid in workers(plane):
            try:
                uids, gids, groups = ids(pid)
                root = os.readlink(f"/proc/{pid}/root")
            except (FileNotFoundError, ProcessLookupError):
                continue
            read += 1
            if not (uids == {account.uid} and gids == {account.gid} and 0 not in groups
                    and root == str(plane.directory / "jail")):
                wrong.append(f"{pid}: uids {uids}, gids {gids}, groups {groups}, root {root}")
        return wrong if read else None

    deadline = time.monotonic() + 20.0
    while (wrong := unjailed()) != [] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert wrong == [], f"HAProxy's workers are not jailed as {account.user}: {wrong}"
    # and from there it still routes, checks, and writes each request's time to the pool's socket
    plane.set_routes([Route("alice/jailed", "alice", probe=PROBE)])
    with replicas("a") as (a,):
        plane.set_backends("alice/jailed", [Backend("j-a", "127.0.0.1", a.port)])
        wait_for("the jailed worker to route",
                 lambda: get(plane.port, "/s/alice/jailed/x", "gp_alice").status_code == 200)
        wait_for("its request's time",
                 lambda: sup(plane).traffic()["alice/jailed"].latency_p50_ms is not None)


@as_root
def test_a_tenant_or_the_routers_account_cannot_open_the_runtime_socket(plane: DataPlane) -> None:
    import subprocess

    from factories import pod_python
    from gpupool.agent.identity import account_name, ensure_account, router_account

    tenant = ensure_account(account_name("sockprobe"))  # a tenant's pod account, as the agent makes it
    router = router_account()
    assert router is not None
    paths = sup(plane).paths
    assert os.stat(paths.runtime_socket).st_uid == os.geteuid()
    probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n"
             "except PermissionError:\n    sys.exit(13)\nsys.exit(0)\n")
    for who in (tenant, router):
        for sock in (paths.runtime_socket, paths.activator_socket):
            done = subprocess.run([pod_python(), "-c", probe, str(sock)], user=who.uid, group=who.gid,
                                  extra_groups=[], env={"PATH": "/usr/bin:/bin"}, cwd="/", check=False)
            assert done.returncode == 13, (who.user, sock.name)  # outside the jail: nothing to reach
    # inside it, the workers reach the activator's and the latency log's sockets, and only those
    jailed = ((paths.jail, 0o710), (paths.activator_socket, 0o620), (paths.latency_log_socket, 0o620))
    for path, mode in jailed:
        st = os.stat(path)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, router.gid, mode), path.name
    assert sorted(p.name for p in paths.jail.iterdir()) == ["activator.sock", "latency.sock"]
    assert sup(plane).runtime.command("show info").startswith("Name: HAProxy")  # the pool's still
