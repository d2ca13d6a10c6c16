"""`gpupool up` processes forked from one that has already imported the server (a fork server).

Starting `python -m gpupool.cli.main up` costs about a second of CPU before the server does anything,
most of it importing FastAPI, SQLAlchemy, alembic, uvicorn and the server's own modules; the live
tests start a hundred such servers on two cores. A `Zygote` is a helper process of the test worker
that imports those once and then forks a child per server. The child becomes what the command line
would have made: its own session, the given environment, working directory, arguments and log on
stdout and stderr, no other file of the helper open, and then runs `gpupool.cli.main` as `-m` runs
it. `Forked` gives the test what `subprocess.Popen` does (pid, signals, poll and wait with the exit
status as Popen reports it): the helper reaps its children and reports each exit.

The server code is the same as the command line's, imported the same way; only the interpreter's
start-up is shared. Environments that change the interpreter itself (PYTHON* variables, such as a
PYTHONPATH naming another release's code) need a process of their own: `usable` says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PRELOAD = (
    "gpupool.cli.main", "gpupool.cli.lazy", "gpupool.cli.up", "gpupool.server.app", "gpupool.server.db",
    "gpupool.server.provision", "gpupool.server.runtime", "gpupool.server.services.tenants",
    "gpupool.server.backup", "gpupool.server.services.netblocks", "gpupool.server.services.audit",
    "gpupool.server.leader", "gpupool.server.schema", "gpupool.gc_tuning", "uvicorn", "uvicorn.main",
    "alembic.command", "alembic.config", "alembic.script", "alembic.runtime.migration",
)
"""What `gpupool up` imports before it serves (each import is only a head start: the child imports
whatever else it needs as a fresh process would)."""


def usable(env: Mapping[str, str]) -> bool:
    """Whether a server with these variables added to the environment can be forked: not when one
    changes how the interpreter starts (the helper started without it)."""
    return not any(k.startswith("PYTHON") and os.environ.get(k) != v for k, v in env.items())


class Forked:
    """A forked server, as much of `subprocess.Popen`'s interface as the tests use."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None
        self.args: list[str] = []

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self.zygote.exit_code(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args or ["gpupool", "up"], timeout or 0.0)
            self.returncode = code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        # polled first, as Popen does: once the helper reported the exit, the pid may be another
        # process's
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # ended, not reaped yet: as Popen finds it
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The helper process of one test worker (started on first use, ended with the worker)."""

    _lock = threading.Lock()
    _current: Zygote | None = None

    @classmethod
    def shared(cls) -> Zygote:
        with cls._lock:
            if cls._current is None or cls._current.proc.poll() is not None:
                cls._current = cls()
            return cls._current

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=None, close_fds=True)
        self._cond = threading.Condition()
        self._exits: dict[int, int] = {}
        self._spawned: list[int | str] = []
        self._send = threading.Lock()
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            with self._cond:
                if "exited" in message:
                    self._exits[message["exited"]] = message["code"]
                else:
                    self._spawned.append(message.get("spawned") or message.get("error", "failed"))
                self._cond.notify_all()
        with self._cond:
            self._spawned.append("the fork server ended")
            self._cond.notify_all()

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> Forked:
        """`python -m gpupool.cli.main ARGV` with exactly `env`, stdout and stderr appended to
        log_path, stdin from /dev/null, in a new session."""
        request = {"argv": list(argv), "env": dict(env), "cwd": os.getcwd(), "log": str(log_path)}
        assert self.proc.stdin is not None
        with self._send:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            with self._cond:
                if not self._cond.wait_for(lambda: self._spawned, timeout=60):
                    raise RuntimeError("the fork server did not answer within 60 s")
                answer = self._spawned.pop(0)
        if isinstance(answer, str):
            raise RuntimeError(f"the fork server could not start gpupool: {answer}")
        return self._forked(answer, argv)

    def _forked(self, pid: int, argv: Sequence[str]) -> Forked:
        """The child `pid` just forked. Its pid may be one an earlier child had (pids are reused
        once reaped): that child's exit, reported before this fork, is not this one's."""
        with self._cond:
            self._exits.pop(pid, None)
        forked = Forked(self, pid)
        forked.args = ["gpupool", *argv]
        return forked

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self.proc.poll() is not None, timeout=timeout)
            return self._exits.get(pid)


# ------------------------------------------------------------------ the helper process itself


def _serve() -> dict[str, Any] | None:
    """Fork a child per request; in the child, return its request (the caller runs it)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below through the pipe
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, "request")
    selector.register(read_end, selectors.EVENT_READ, "exit")
    pending = b""
    children: set[int] = set()

    def say(message: dict[str, Any]) -> None:
        os.write(1, json.dumps(message).encode() + b"\n")

    def reap() -> None:
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                say({"exited": pid, "code": os.waitstatus_to_exitcode(status)})

    while True:
        for key, _ in selector.select():
            if key.data == "exit":
                os.read(read_end, 4096)
                reap()
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                return None  # the test worker ended
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                try:
                    pid = os.fork()
                except OSError as exc:
                    say({"error": str(exc)})
                    continue
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    selector.close()
                    os.close(read_end)
                    os.close(write_end)
                    return dict(request)
                children.add(pid)
                say({"spawned": pid})
        reap()


def _become(request: dict[str, Any]) -> None:
    """Turn this forked child into `python -m gpupool.cli.main ARGV` as Popen would have started it."""
    import runpy

    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.closerange(3, min(os.sysconf("SC_OPEN_MAX"), 65536))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    main_path = sys.modules["gpupool.cli.main"].__file__
    assert main_path is not None
    sys.argv = [main_path, *request["argv"]]
    sys.path[0] = request["cwd"]
    del sys.modules["gpupool.cli.main"]  # as under -m: run as __main__, not found already imported
    runpy.run_module("gpupool.cli.main", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    wanted = _serve()
    if wanted is not None:
        _become(wanted)
