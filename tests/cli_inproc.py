"""Run the `gpupool` command inside the test process, as a child process would run it.

A child `python -m gpupool.cli.main` spends about 0.2 s of CPU importing typer, httpx, pydantic and
the API models before it does anything; the CLI tests run hundreds of them. Here `gpupool.cli.main.main`
runs in this process instead, with exactly the environment, arguments, working directory and empty
stdin a child would get, its stdout and stderr captured apart, and its exit status taken from the
`SystemExit` the entry point always ends with. What is not the same is left to a real process:

- `run`, `alloc` and `exec` (cli/main.py FAST_COMMANDS, less `submit`, which only prints) write to
  file descriptors and forward signals, and `up`, `node join`, `backup` and `restore` serve, set
  signal handlers or work on a data directory as the server's process: they still run as a child;
- an exception the entry point does not turn into an exit status propagates to the test (a child
  would print a traceback and exit 1: either way the test fails).

Calls are serialised (one lock): the environment, argv, cwd and standard streams are per process.
For the same reason a server running in this process (tests/live.py) sees the command's environment
while a call runs: a test about what that server's pods inherit from its environment (a secret set
in os.environ, as tests/cli/test_alloc_exec_live.py does) keeps running the CLI as a child.

The command's environment is what `os.environ` holds while it runs (what it writes there itself
included); the process's C environment (libc's `environ`) is left as it is. Changing that calls
setenv and unsetenv, which may move or free what another thread's getenv is reading (a time zone or
a resolver lookup): a pytest worker died of a segfault in libc so, in a test whose process had other
threads. No in-process command starts a child, which would inherit the C environment.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpupool.cli.main import FAST_COMMANDS, main

if TYPE_CHECKING:
    from _typeshed import StrOrBytesPath

_LOCK = threading.Lock()
CHILD_COMMANDS = (frozenset(FAST_COMMANDS) - {"submit"}) | {"up", "backup", "restore"}
"""Commands that always run as a child process (and `node join`)."""


def run_cli(args: Sequence[str], env: Mapping[str, str], *, cwd: str | Path | None = None,
            timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """`gpupool ARGS...` with exactly `env` as its environment, like subprocess.run(capture_output=True,
    text=True, stdin=DEVNULL) of `python -m gpupool.cli.main ARGS...`."""
    argv = [sys.executable, "-m", "gpupool.cli.main", *args]
    env = dict(env)  # a copy: `env` may be os.environ itself, which is replaced below
    if args and (args[0] in CHILD_COMMANDS or (args[0] in ("node", "nodes") and list(args[1:2]) == ["join"])):
        return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    out, err = io.StringIO(), io.StringIO()
    with _LOCK:
        saved_env, saved_argv, saved_stdin, saved_cwd = dict(os.environ), sys.argv, sys.stdin, os.getcwd()
        # Until the test's environment is back, os.environ's writes stay in os.environ: the command's
        # environment and what the command itself writes (typer sets PYDANTIC_DISABLE_PLUGINS around
        # each option it builds, then deletes it).
        saved_putenv, saved_unsetenv = os.putenv, os.unsetenv
        os.putenv, os.unsetenv = _putenv_not, _unsetenv_not
        try:
            _hold(env)
            sys.argv = ["gpupool", *args]
            sys.stdin = io.StringIO("")
            if cwd is not None:
                os.chdir(cwd)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    main()
                    code = 0
                except SystemExit as exc:
                    code = _exit_status(exc, err)
        finally:
            os.chdir(saved_cwd)
            sys.stdin, sys.argv = saved_stdin, saved_argv
            _hold(saved_env)
            os.putenv, os.unsetenv = saved_putenv, saved_unsetenv
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def _hold(env: Mapping[str, str]) -> None:
    """Make `os.environ` hold exactly `env`: the new values are set before the keys not in `env` go,
    so a key in both is never missing for a thread reading it meanwhile."""
    os.environ.update(env)
    for key in [key for key in os.environ if key not in env]:
        del os.environ[key]


def _putenv_not(key: StrOrBytesPath, value: StrOrBytesPath) -> None:
    """os.environ's putenv while an in-process command runs: the C environment is left alone."""


def _unsetenv_not(key: StrOrBytesPath) -> None:
    """os.environ's unsetenv while an in-process command runs."""


def _exit_status(exc: SystemExit, err: io.StringIO) -> int:
    """The status a process ending with `exc` exits with (a non-int code is printed to stderr, status 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=err)
    return 1
