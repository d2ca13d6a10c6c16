"""Run another command inside a live pod (`gpupool exec`, `gpupool alloc -- CMD`).

The agent remembers, for each pod it launched, what the pod runs with: its Unix account, network
namespace, cgroup, process limits, working directory and environment (exactly the pod's: its
CUDA_VISIBLE_DEVICES, MPS limits and GPUPOOL_* variables, never the agent's). An exec starts the
command the way the pod's shim was started: through the account's launcher helper (launcher.py),
which joins the pod's network namespace while still root, drops the supplementary groups, gid then
uid, closes every descriptor but the exec's own, and execs a small shell script as the account. The
script waits for one line before it runs anything, so it is in the pod's cgroup before the command
starts (the agent writes cgroup.procs, which the account may not), applies the pod's RLIMITs and
enters its working directory as the account.

Standard input, output and error are pipes, or one pseudo-terminal (`pty`: the command gets it as its
controlling terminal through util-linux `setsid --ctty`, so Ctrl-C typed into it reaches the
foreground job and a window size change sends SIGWINCH). The agent keeps the other ends, which the
server reads and writes without blocking. An exec ends with the pod: stopping the pod kills its
execs' process groups.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty as ptys
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.agent.identity import PodIdentity
from gpupool.agent.launcher import EXIT_FD_PLACEHOLDER, Launcher
from gpupool.agent.leftovers import pod_mark
from gpupool.errors import Conflict, InvalidInput, NotFound, ProviderError

SCRIPT = r"""
go=$1 pty=$2 rlimit_kib=$3 nproc=$4 workdir=$5
shift 5
read -r joined < "/dev/fd/$go" || exit 125
[ "$joined" = ok ] || echo "gpupool: $joined" >&2
if [ -n "$rlimit_kib" ]; then ulimit -d "$rlimit_kib"; fi
if [ -n "$nproc" ]; then { ulimit -p "$nproc" || ulimit -u "$nproc"; } 2>/dev/null; fi
if ! cd -- "$workdir" 2>/dev/null; then
  echo "gpupool: cannot enter the working directory $workdir" >&2
  exit 126
fi
if ! command -v "$1" > /dev/null 2>&1; then
  echo "gpupool: cannot start '$1': not found or not executable" >&2
  exit 127
fi
if [ -n "$pty" ] && command -v setsid > /dev/null 2>&1; then exec setsid --ctty --wait "$@"; fi
exec "$@"
"""
MAX_COMMAND_ARGS = 4096
MAX_EXECS_PER_POD = 32
"""Execs running in one pod at once: each holds descriptors in the agent and a stream in the server."""
IN_IMAGE = "in-image"
_EXIT_REPORT_WAIT_S = 10.0


@dataclass(frozen=True)
class ExecContext:
    """What a pod runs with, kept by the agent at launch for later execs."""

    env: Mapping[str, str]
    identity: PodIdentity | None
    netns: str
    cgroup_dir: Path | None
    workdir: str
    rlimit_data_bytes: int | None = None
    rlimit_nproc: int | None = None


@dataclass
class ExecSession:
    """One running exec: the agent's ends of its standard streams, and how to signal and wait for it.

    `stdin` is written, `stdout` and `stderr` read (the same descriptor, the pty's master, with
    `pty`; then `stderr` is -1). All three are non-blocking."""

    pid: int
    stdin: int
    stdout: int
    stderr: int
    pty: bool
    _wait: object = field(repr=False, default=None)
    _closed: bool = False
    pidfd: int = -1
    """Readable once the command's process ended (a pidfd), so a caller waits without a thread."""
    _on_close: object = field(repr=False, default=None)

    def resize(self, rows: int, cols: int) -> None:
        """Tell the pty its window size (the command gets SIGWINCH); ignored without a pty."""
        if self.pty and 0 < rows < 10_000 and 0 < cols < 10_000:
            with contextlib.suppress(OSError):
                fcntl.ioctl(self.stdout, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def close_stdin(self) -> None:
        """End of input (without a pty; a pty's input ends with the terminal's EOF character)."""
        if not self.pty and self.stdin >= 0:
            with contextlib.suppress(OSError):
                os.close(self.stdin)
            self.stdin = -1

    def signal(self, signum: int) -> None:
        """Send `signum` to the exec's process group (its own session, not the pod's)."""
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signum)

    def wait(self) -> int:
        """Block until the command ended; its exit code (128 + N when killed by signal N)."""
        assert callable(self._wait)
        code = int(self._wait())
        return 128 - code if code < 0 else code

    def close(self) -> None:
        """Kill what is left of the exec and close the agent's descriptors. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.signal(signal.SIGKILL)
        if callable(self._on_close):
            self._on_close(self)
        for fd in {self.stdin, self.stdout, self.stderr, self.pidfd} - {-1}:
            with contextlib.suppress(OSError):
                os.close(fd)


class Execs:
    """The exec contexts of this node's pods, and their running execs."""

    def __init__(self, launcher: Callable[[], Launcher], agent_mark: str) -> None:
        self._launcher = launcher
        self._agent_mark = agent_mark
        self._lock = threading.Lock()
        self._contexts: dict[str, ExecContext | str] = {}
        self._running: dict[str, list[ExecSession]] = {}

    def remember(self, pod_id: str, context: ExecContext | str) -> None:
        """The pod's context, or why nothing can run inside it (IN_IMAGE)."""
        with self._lock:
            self._contexts[pod_id] = context

    def _forget(self, pod_id: str, session: ExecSession) -> None:
        with self._lock:
            running = self._running.get(pod_id, [])
            if session in running:
                running.remove(session)

    def end_pod(self, pod_id: str) -> None:
        """The pod is stopping or ended: no new exec, and those running are killed."""
        with self._lock:
            self._contexts.pop(pod_id, None)
            sessions = self._running.pop(pod_id, [])
        for session in sessions:
            session.signal(signal.SIGKILL)

    def start(self, pod_id: str, command: Sequence[str], *, pty: bool = False, rows: int = 0,
              cols: int = 0) -> ExecSession:
        """Start `command` inside the pod. NotFound when this agent has no live pod `pod_id` (it
        ended, or was started before this agent's restart); InvalidInput for a bad command."""
        if not command or len(command) > MAX_COMMAND_ARGS or any(
                not isinstance(a, str) or "\0" in a for a in command):
            raise InvalidInput("Give the command to run as a non-empty list of strings without NUL bytes.")
        with self._lock:
            context = self._contexts.get(pod_id)
        if context is None:
            raise NotFound(f"Pod {pod_id} is not running on this node (it ended, or was started before "
                           "its node agent restarted); exec runs only in a live pod.")
        if context == IN_IMAGE:
            raise ProviderError(f"Pod {pod_id} runs in a container image; gpupool exec into containers is "
                                "not supported yet.")
        assert isinstance(context, ExecContext)
        with self._lock:
            if len(self._running.get(pod_id, [])) >= MAX_EXECS_PER_POD:
                raise Conflict(f"Pod {pod_id} already runs {MAX_EXECS_PER_POD} execs, the most at once; "
                               "wait for one to end.")
        ours: list[int] = []
        theirs: list[int] = []
        try:
            if pty:
                master, slave = ptys.openpty()
                ours.append(master)
                theirs.append(slave)
                stdin_r, stdout_w, stderr_w = slave, slave, slave
                session_fds = (master, master, -1)
            else:
                in_r, in_w = os.pipe()
                out_r, out_w = os.pipe()
                err_r, err_w = os.pipe()
                ours += [in_w, out_r, err_r]
                theirs += [in_r, out_w, err_w]
                stdin_r, stdout_w, stderr_w = in_r, out_w, err_w
                session_fds = (in_w, out_r, err_r)
            go_r, go_w = os.pipe()
            theirs.append(go_r)
            ours.append(go_w)
            if context.identity is not None:  # the account reopens them by /dev/fd (the script, /dev/stdin)
                for fd in theirs:
                    os.fchown(fd, context.identity.uid, context.identity.gid)
            session = self._spawn(pod_id, context, list(command), pty, stdin_r, stdout_w, stderr_w,
                                  go_r, session_fds)
        except BaseException:
            for fd in ours:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        finally:
            for fd in theirs:
                with contextlib.suppress(OSError):
                    os.close(fd)
        # into the pod's cgroup before the command runs; then let it go
        answer = "ok"
        if context.cgroup_dir is not None:
            try:
                (context.cgroup_dir / "cgroup.procs").write_text(str(session.pid))
            except OSError as exc:
                answer = f"could not join cgroup {context.cgroup_dir} ({exc.strerror}); limits not enforced"
        with contextlib.suppress(OSError):
            os.write(go_w, (answer + "\n").encode())
        os.close(go_w)
        for fd in {session.stdin, session.stdout, session.stderr} - {-1}:
            os.set_blocking(fd, False)
        with self._lock:
            if pod_id not in self._contexts:  # the pod ended meanwhile
                session.close()
                raise NotFound(f"Pod {pod_id} ended; exec runs only in a live pod.")
            self._running.setdefault(pod_id, []).append(session)
        session._on_close = lambda ended: self._forget(pod_id, ended)
        session.resize(rows, cols)
        return session

    def _spawn(self, pod_id: str, context: ExecContext, command: list[str], pty: bool, stdin: int,
               stdout: int, stderr: int, go_r: int, session_fds: tuple[int, int, int]) -> ExecSession:
        rlimit_kib = str(max(1, context.rlimit_data_bytes // 1024)) if context.rlimit_data_bytes else ""
        nproc = str(max(1, context.rlimit_nproc)) if context.rlimit_nproc else ""
        # the pod's mark: its leftovers sweep ends the exec too
        env = {**context.env, **pod_mark(self._agent_mark, pod_id)}
        if pty:
            env.setdefault("TERM", "xterm-256color")
        if context.identity is not None:
            launcher: Launcher = self._launcher()
            argv = ["/bin/sh", "-c", SCRIPT, "gpupool-exec", EXIT_FD_PLACEHOLDER, "1" if pty else "",
                    rlimit_kib, nproc, context.workdir, *command]
            pid, _ticks = launcher.launch(argv, env, context.identity, stdin=stdin, stdout=stdout,
                                          stderr=stderr, exit_fd=go_r, netns=context.netns)

            def wait() -> int:
                return _wait_reported(launcher, pid)
        else:  # pods run as the agent's own user (not root): a plain child in its own session
            argv = ["/bin/sh", "-c", SCRIPT, "gpupool-exec", str(go_r), "1" if pty else "", rlimit_kib,
                    nproc, context.workdir, *command]
            child = subprocess.Popen(argv, cwd="/", env=env, stdin=stdin, stdout=stdout, stderr=stderr,
                                     start_new_session=True, close_fds=True, pass_fds=(go_r,))
            pid = child.pid
            wait = child.wait
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # it is gone already (or no pidfds): wait() answers at once or in a thread
            pidfd = -1
        return ExecSession(pid, *session_fds, pty=pty, _wait=wait, pidfd=pidfd)


def _wait_reported(launcher: Launcher, pid: int) -> int:
    """The exit status of a helper's child: wait for it to exit (a pidfd), then for the helper's report."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        pidfd = -1
    if pidfd >= 0:
        try:
            select.select([pidfd], [], [])
        finally:
            os.close(pidfd)
    deadline = time.monotonic() + _EXIT_REPORT_WAIT_S
    while True:
        code = launcher.returncode(pid)
        if code is not None:
            return code
        if time.monotonic() > deadline:
            raise ProviderError(f"The exec's process {pid} ended but its exit status was not reported.")
        time.sleep(0.01)
