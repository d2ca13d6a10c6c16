"""`gpupool alloc` and `gpupool exec` against a live server on a simulated local node: the command runs
inside the allocation's pod (its devices, its workload id, its account, its network namespace), the
allocation is released when the command exits, and the exec stream is the caller's alone.

Runs the CLI as a subprocess (a real WebSocket through the server to the node's agent). The account
and network namespace checks need root (and iproute2/nftables for the namespace); elsewhere they skip
with the reason."""

from __future__ import annotations

import ipaddress
import os
import pty
import select
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gpupool.agent import netns
from gpupool.client import Client
from gpupool.providers.local import LocalProvider
from live import LiveServer, live_server
from server.upproc import until

pytestmark = pytest.mark.slow
ROOT = os.geteuid() == 0
NETNS_WHY = netns.probe()
NETWORK = ipaddress.IPv4Network("10.236.0.0/16")
"""This file's own pod network (test files that run at once never share one)."""
SECRET = "server-only-secret-4711"
Pool = tuple[LiveServer, LocalProvider, dict[str, str]]


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    tmp = tmp_path_factory.mktemp("alloc")
    network = netns.NetworkSettings(mode=netns.NetnsMode.ON, pod_network=NETWORK) if not NETNS_WHY else None
    provider = LocalProvider(tmp / "agent", simulate="2xH100", node_name="box", network=network)
    os.environ["GPUPOOL_TEST_SERVER_SECRET"] = SECRET  # in the server's (this process's) environment
    try:
        with live_server(tmp / "data", provider) as server, Client(server.url, server.admin_token) as admin:
            tokens = {}
            for tenant in ("alice", "mallory"):
                admin.create_tenant(tenant)
                tokens[tenant] = admin.create_token(tenant).token
            tokens["admin"] = server.admin_token
            yield server, provider, tokens
    finally:
        os.environ.pop("GPUPOOL_TEST_SERVER_SECRET", None)
        provider.close(stop_pods=True)


def gp(pool: Pool, *args: str, who: str = "alice",
       stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    server, _, tokens = pool
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(GPUPOOL_URL=server.url, GPUPOOL_TOKEN=tokens[who])
    return subprocess.run([sys.executable, "-m", "gpupool.cli.main", *args], env=env, cwd="/", text=True,
                          capture_output=True, timeout=timeout, input=stdin,
                          stdin=None if stdin is not None else subprocess.DEVNULL)


def held(pool: Pool, *options: str, who: str = "alice") -> str:
    """A held allocation's id (alloc in a script prints it and keeps it)."""
    made = gp(pool, "alloc", *options, who=who)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def workload(pool: Pool, wid: str) -> dict[str, object]:
    server, _, _ = pool
    with Client(server.url, server.admin_token) as admin:
        return admin.workload(wid).model_dump()


def test_alloc_runs_the_command_inside_and_releases_it(pool: Pool
                                                       ) -> None:
    server, _, _ = pool
    script = ('echo "cuda=$CUDA_VISIBLE_DEVICES wid=$GPUPOOL_WORKLOAD_ID uid=$(id -u) '
              'ns=$(readlink /proc/self/ns/net) secret=${GPUPOOL_TEST_SERVER_SECRET:-none}"; exit 5')
    ran = gp(pool, "alloc", "--gpus", "1", "--", "sh", "-c", script)
    assert ran.returncode == 5, ran.stderr
    fields = dict(part.split("=", 1) for part in ran.stdout.split())
    wid = fields["wid"]
    assert wid.startswith("w") and f"allocation {wid} released" in ran.stderr
    assert fields["cuda"] != "" and fields["secret"] == "none"
    until(lambda: workload(pool, wid)["status"] == "cancelled", what=f"{wid} released")

    def freed() -> bool:  # its device is free again
        with Client(server.url, server.admin_token) as admin:
            return all(d.allocated_milli == 0 for n in admin.nodes() for d in n.devices)

    until(freed, what="the allocation's device freed")


@pytest.mark.skipif(not ROOT, reason="pods run as the tenant's own account only when the agent is root")
def test_exec_runs_as_the_pods_account_in_its_network_namespace(
        pool: Pool) -> None:
    _, provider, _ = pool
    wid = held(pool, "--gpus", "0.5")
    try:
        pod = next(r for r in provider.agent.poll() if r.pod_id.startswith(wid) and not r.finished)
        assert pod.uid is not None and pod.pid is not None
        inside = gp(pool, "exec", wid, "--", "sh", "-c",
                    'echo "$(id -u) $(readlink /proc/self/ns/net) $CUDA_VISIBLE_DEVICES '
                    '$GPUPOOL_WORKLOAD_ID"')
        assert inside.returncode == 0, inside.stderr
        uid, ns, cuda, seen = inside.stdout.split()
        assert int(uid) == pod.uid != 0
        assert seen == wid and cuda
        if not NETNS_WHY:
            assert ns == os.readlink(f"/proc/{pod.pid}/ns/net") != os.readlink("/proc/self/ns/net")
        # exactly the pod's environment (its shim's, as the agent started it), nothing of the server's
        env = gp(pool, "exec", wid, "--", "sh", "-c", "cat /proc/$$/environ")
        assert env.returncode == 0, env.stderr
        with open(f"/proc/{pod.pid}/environ", "rb") as pods:
            shims = pods.read().decode()

        def variables(environ: str) -> set[str]:  # PWD and OLDPWD: set by the `cd` into its directory
            return {v for v in environ.split("\0") if v and not v.startswith(("PWD=", "OLDPWD="))}

        assert variables(env.stdout) == variables(shims)
        assert SECRET not in env.stdout
        # no descriptor of the server's or the agent's: its stdio and the one its start-up line came on
        fds = gp(pool, "exec", wid, "--", "sh", "-c", "exec ls /proc/self/fd")
        assert fds.returncode == 0, fds.stderr
        assert {"0", "1", "2"} <= set(fds.stdout.split()) and len(fds.stdout.split()) <= 5, fds.stdout
    finally:
        gp(pool, "cancel", wid)


@pytest.mark.skipif(not ROOT, reason="pods run as the tenant's own account only when the agent is root")
def test_another_tenants_pod_cannot_open_an_exec_terminal(pool: Pool) -> None:
    server, _, tokens = pool
    mine, theirs = held(pool, "--gpus", "0.5"), held(pool, "--gpus", "0.5", who="mallory")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(GPUPOOL_URL=server.url, GPUPOOL_TOKEN=tokens["alice"])
    argv = ["exec", "--pty", mine, "--", "sh", "-c", "tty; read line; echo got:$line"]
    proc = subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", *argv], env=env, cwd="/",
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        terminal = proc.stdout.readline().strip()
        assert terminal.startswith("/dev/pts/")
        hijack = gp(pool, "exec", theirs, "--", "sh", "-c", f"echo injected > {terminal} || cat {terminal}",
                    who="mallory")
        assert hijack.returncode != 0 and "Permission denied" in hijack.stderr
        proc.stdin.write("mine\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "got:mine" in out and "injected" not in out
    finally:
        proc.kill()
        gp(pool, "cancel", mine)
        gp(pool, "cancel", theirs, who="mallory")


def test_exec_pipes_stdin_and_returns_the_code(pool: Pool) -> None:
    wid = held(pool, "--gpus", "0.5")
    try:
        piped = gp(pool, "exec", wid, "--", "sh", "-c", "tr a-z A-Z; echo err >&2; exit 3",
                   stdin="hello\nworld\n")
        assert piped.returncode == 3, piped.stderr
        assert piped.stdout == "HELLO\nWORLD\n" and piped.stderr == "err\n"
        tty = gp(pool, "exec", "--pty", wid, "--", "sh", "-c", "test -t 0 && test -t 1 && tty")
        assert tty.returncode == 0, tty.stderr
        assert tty.stdout.strip().startswith("/dev/pts/")
        big = 3 * 1024 * 1024 + 7  # more than any pipe or frame holds: flow control both ways
        through = gp(pool, "exec", wid, "--", "sh", "-c", "wc -c; head -c 3000001 /dev/zero | tr '\\0' x",
                     stdin="y" * big)
        assert through.returncode == 0, through.stderr
        assert through.stdout.startswith(f"{big}\n") and through.stdout[len(f"{big}\n"):] == "x" * 3000001
        notty = gp(pool, "exec", wid, "--", "sh", "-c", "test -t 0")
        assert notty.returncode == 1
        assert workload(pool, wid)["status"] == "running"  # an exec's end is not the allocation's
    finally:
        gp(pool, "cancel", wid)


def test_exec_forwards_ctrl_c_to_the_command(pool: Pool) -> None:
    wid = held(pool, "--gpus", "0.5")
    script = "trap 'echo interrupted; exit 9' INT; echo ready; while :; do sleep 0.05; done"
    proc = _popen(pool, "exec", wid, "--", "sh", "-c", script)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"  # the command runs: now interrupt it
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 9, err
        assert out == "interrupted\n"
    finally:
        proc.kill()
        gp(pool, "cancel", wid)


def _popen(pool: Pool, *args: str) -> subprocess.Popen[str]:
    server, _, tokens = pool
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(GPUPOOL_URL=server.url, GPUPOOL_TOKEN=tokens["alice"])
    return subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", *args], env=env, cwd="/",
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_an_exec_ends_with_its_allocation(pool: Pool) -> None:
    wid = held(pool, "--gpus", "0.5")
    proc = _popen(pool, "exec", wid, "--", "sh", "-c", "echo ready; exec sleep 600")
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert gp(pool, "cancel", wid).returncode == 0
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGKILL, err
    finally:
        proc.kill()


def test_alloc_says_why_it_waits_and_ctrl_c_cancels_it(pool: Pool) -> None:
    everything = held(pool, "--gpus", "2")
    proc = _popen(pool, "alloc", "--gpus", "1", "--", "true")
    try:
        assert proc.stderr is not None
        submitted = proc.stderr.readline()
        assert submitted.startswith("gpupool: allocation w")
        wid = submitted.split()[2]
        pending = proc.stderr.readline()
        assert pending.startswith(f"gpupool: {wid} pending: "), pending
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGINT, err
        assert f"allocation {wid} cancelled" in err
        assert workload(pool, wid)["status"] == "cancelled"
    finally:
        proc.kill()
        gp(pool, "cancel", everything)


def test_alloc_on_a_terminal_opens_a_shell_inside_and_releases_it_on_exit(pool: Pool) -> None:
    server, _, tokens = pool
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(GPUPOOL_URL=server.url, GPUPOOL_TOKEN=tokens["alice"], SHELL="/bin/sh")
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", "alloc", "--gpus", "0.5"], env=env,
                            cwd="/", stdin=slave, stdout=slave, stderr=subprocess.PIPE, text=True)
    os.close(slave)
    seen = b""
    try:
        typed = False
        while proc.poll() is None or select.select([master], [], [], 0)[0]:
            if not select.select([master], [], [], 60)[0]:
                raise AssertionError(f"no output from the shell: {seen!r}")
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's last user is gone
                break
            seen += chunk
            if not typed and b"$ " in seen:  # the shell's prompt: it reads from its own terminal
                os.write(master, b'test -t 0 && echo "in:$GPUPOOL_WORKLOAD_ID"; exit 4\r')
                typed = True
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        os.close(master)
    assert proc.returncode == 4, (seen, err)
    wid = err.split()[2]
    assert f"in:{wid}".encode() in seen
    until(lambda: workload(pool, wid)["status"] == "cancelled", what=f"{wid} released")


def test_another_tenant_and_the_admin_cannot_exec(pool: Pool
                                                 ) -> None:
    wid = held(pool, "--gpus", "0.5")
    try:
        stolen = gp(pool, "exec", wid, "--", "true", who="mallory")
        assert stolen.returncode == 3
        assert stolen.stderr == f"Error: No workload {wid!r}; list yours with `gpupool ls`.\n"
        admin = gp(pool, "exec", wid, "--", "true", who="admin")
        assert admin.returncode == 3 and "use that tenant's token" in admin.stderr
        unknown = gp(pool, "exec", "w-nope", "--", "true")
        assert unknown.returncode == 3 and "No workload 'w-nope'" in unknown.stderr
        usage = gp(pool, "exec", wid)
        assert usage.returncode == 2 and "usage: gpupool exec ID" in usage.stderr
        rank = gp(pool, "exec", "--rank", "one", wid, "--", "true")
        assert rank.returncode == 2
        said = "Error: --rank takes a replica number (0, 1, ... up to 2147483647), not 'one'.\n"
        assert rank.stderr == said
        below = gp(pool, "exec", "--rank", "-1", wid, "--", "true")  # refused here, not by the server
        assert below.returncode == 2
        assert below.stderr == said.replace("'one'", "'-1'")
        beyond = gp(pool, "exec", "--rank=3", wid, "--", "true")  # one pod: only rank 0 runs
        assert beyond.returncode == 3
        assert beyond.stderr == (f"Error: Workload {wid} has no running pod of rank 3 (it is running); give "
                                 f"a rank from 0 to its replicas less one (`gpupool show {wid}` lists its "
                                 "pods).\n")
        gang = gp(pool, "alloc", "--replicas", "2", "--", "true")
        assert gang.returncode == 2 and "an allocation is one pod" in gang.stderr
    finally:
        gp(pool, "cancel", wid)


def test_exec_into_an_ended_allocation_is_refused_with_a_sentence(
        pool: Pool) -> None:
    wid = held(pool, "--gpus", "0.5")
    assert gp(pool, "cancel", wid).returncode == 0
    until(lambda: workload(pool, wid)["status"] == "cancelled", what=f"{wid} cancelled")
    late = gp(pool, "exec", wid, "--", "true")
    assert late.returncode == 3
    assert late.stderr == (f"Error: Workload {wid} has ended (cancelled); exec runs only inside a running "
                           "workload. Start a new allocation with `gpupool alloc`.\n")
