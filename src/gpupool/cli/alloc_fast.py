"""`gpupool alloc [submit options] [-- CMD]` and `gpupool exec ID [--pty] -- CMD` (salloc, srun --pty
inside it, kubectl exec).

An allocation is a workload whose pod holds its slice with a sleeper (`sleep infinity`), supervised,
metered, time-limited and preemptible like any other. `alloc` submits it, waits for its placement
(saying why it waits; Ctrl-C cancels it), then:
- with `-- CMD`: runs CMD inside it (a pseudo-terminal when this terminal is one), releases the
  allocation when CMD exits, and exits with CMD's code;
- on a terminal without a command: opens an interactive shell inside it, released when it exits;
- otherwise (a script: `ID=$(gpupool alloc --gpus 1)`): prints the id and leaves it held, for
  `gpupool exec ID -- CMD` and `gpupool cancel ID`.

`exec` streams stdin, stdout and stderr through a WebSocket to the server, which asks the node's agent
to start the command as the pod's account in its network namespace, cgroup and environment
(server/routers/execs.py). Ctrl-C is sent to the command (with --pty the terminal is raw, so it is
the command's own terminal that turns it into SIGINT); the exit code is the command's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any

from gpupool.cli.submit_fast import UsageError, parse

SLEEPER = ["sleep", "infinity"]
POLL_S = 0.2
STDIN, STDOUT, STDERR, RESIZE, STDIN_EOF, SIGNAL = 0, 1, 2, 3, 4, 5
SHELL = ["/bin/sh", "-c", 'exec "${SHELL:-/bin/sh}" -i']
EXEC_USAGE = "usage: gpupool exec ID [--pty|-t] [--rank N] -- CMD [ARG...]"
MAX_MESSAGE = 1 << 20
MAX_RANK = 2**31
"""Past any gang's ranks: the server's bound (server/routers/execs.py), said of --rank here."""
EMPTY_COMMAND = "the program after `--` is empty; give the command to run, e.g. {example}."


def _error(message: str, code: int) -> int:
    print(f"Error: {message}", file=sys.stderr)
    return code


def exec_command(workload_id: str, command: list[str], *, pty: bool, rank: int = 0,
                 url: str | None = None, token: str | None = None) -> int:
    """Run `command` inside the workload's live pod of `rank`, streaming this process's stdin,
    stdout and stderr; the command's exit code (2 refused, 3 not found, 4 unreachable)."""
    from websockets.exceptions import ConnectionClosed, InvalidHandshake
    from websockets.sync.client import connect

    from gpupool.clientconfig import ca_bundle, resolve

    urls, bearer = resolve(url, token)
    base = urls.split(",")[0]  # the first of the pool's servers, as the API client starts with
    secure = base.startswith("https://")
    target = ("wss" + base[5:] if secure else "ws" + base[4:]) + "/api/v1"
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    context = None
    if secure:
        import ssl

        context = ssl.create_default_context(cafile=ca_bundle())  # the pool's private CA when named
    try:
        ws = connect(f"{target}/workloads/{workload_id}/exec", additional_headers=headers, ssl=context,
                     max_size=MAX_MESSAGE, open_timeout=30)
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        return _error(f"cannot reach the pool at {base} ({exc}); is `gpupool up` running?", 4)
    with ws:
        rows, cols = _size() if pty else (0, 0)
        ws.send(json.dumps({"command": command, "rank": rank, "pty": pty, "rows": rows, "cols": cols}))
        first = json.loads(ws.recv())
        if "error" in first:
            return _error(first["error"], 3 if first.get("status") in (401, 403, 404) else 2)
        raw = pty and os.isatty(0)
        saved = _raw_mode() if raw else None
        previous: dict[int, Any] = {}

        def forward(signum: int, _frame: object) -> None:
            with contextlib.suppress(ConnectionClosed):
                if signum == signal.SIGWINCH:
                    r, c = _size()
                    ws.send(bytes([RESIZE]) + json.dumps({"rows": r, "cols": c}).encode())
                else:
                    ws.send(bytes([SIGNAL]) + json.dumps({"signal": signum}).encode())

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGWINCH):
            previous[signum] = signal.signal(signum, forward)
        threading.Thread(target=_send_stdin, args=(ws, pty), daemon=True).start()
        try:
            while True:
                try:
                    message = ws.recv()
                except ConnectionClosed:
                    return _error("the pool closed the exec's stream before the command ended.", 1)
                if isinstance(message, bytes):
                    out = 1 if message[:1] == bytes([STDOUT]) else 2
                    _write_all(out, message[1:])
                    continue
                answer = json.loads(message)
                if "exit_code" in answer:
                    return int(answer["exit_code"])
                if "error" in answer:
                    return _error(answer["error"], 1)
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
            if saved is not None:
                import termios

                termios.tcsetattr(0, termios.TCSADRAIN, saved)


def _send_stdin(ws: Any, pty: bool) -> None:
    from websockets.exceptions import ConnectionClosed

    with contextlib.suppress(ConnectionClosed, OSError):
        while True:
            data = os.read(0, 64 * 1024)
            if not data:
                if not pty:
                    ws.send(bytes([STDIN_EOF]))
                return
            ws.send(bytes([STDIN]) + data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _size() -> tuple[int, int]:
    size = shutil.get_terminal_size((80, 24))
    return size.lines, size.columns


def _raw_mode() -> Any:
    import termios
    import tty

    saved = termios.tcgetattr(0)
    tty.setraw(0)
    return saved


def exec_run(args: list[str]) -> int:
    """`gpupool exec ID [--pty|-t] [--rank N] -- CMD`."""
    pty, rank, rest = False, 0, list(args)
    options = rest[: rest.index("--")] if "--" in rest else rest
    command = rest[rest.index("--") + 1:] if "--" in rest else []
    words: list[str] = []
    i = 0
    while i < len(options):
        arg = options[i]
        if arg in ("--pty", "-t", "-it", "-ti"):
            pty = True
        elif arg == "-i":
            pass  # stdin is always passed (kubectl's -i)
        elif (arg in ("--rank", "-r") and i + 1 < len(options)) or arg.startswith("--rank="):
            if "=" in arg:
                value = arg.partition("=")[2]
            else:
                i += 1
                value = options[i]
            try:
                rank = int(value)
                if not 0 <= rank < MAX_RANK:
                    raise ValueError
            except ValueError:
                return _error(f"--rank takes a replica number (0, 1, ... up to {MAX_RANK - 1}), not "
                              f"{value!r}.", 2)
        elif arg.startswith("-"):
            return _error(f"no option {arg}; {EXEC_USAGE}", 2)
        else:
            words.append(arg)
        i += 1
    if len(words) != 1 or not command:
        return _error(f"give one workload id and the command after `--`; {EXEC_USAGE}", 2)
    if not command[0].strip():
        return _error(EMPTY_COMMAND.format(example="gpupool exec ID -- nvidia-smi"), 2)
    from gpupool.errors import GpupoolError

    try:
        return exec_command(words[0], command, pty=pty, rank=rank)
    except GpupoolError as exc:
        return _error(exc.message, exc.exit_code)


class _Interrupted:
    def __init__(self) -> None:
        self.received: int | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        self.received = signum


def run(args: list[str]) -> int:
    """`gpupool alloc [submit options] [-- CMD]`."""
    options = args[: args.index("--")] if "--" in args else args
    command = args[args.index("--") + 1:] if "--" in args else []
    if command and not command[0].strip():  # refused before an allocation is held for it
        return _error(EMPTY_COMMAND.format(example="gpupool alloc --gpus 1 -- python train.py"), 2)
    try:
        spec = parse([*options, "--", *SLEEPER])
    except UsageError as exc:
        return _error(str(exc), 2)
    if spec.get("array") is not None or int(spec.get("replicas", 1)) != 1:  # type: ignore[call-overload]
        return _error("an allocation is one pod; leave out --array and --replicas.", 2)
    spec.setdefault("name", "alloc")
    interactive = not command and os.isatty(0) and os.isatty(1)
    from gpupool.client import Client
    from gpupool.errors import GpupoolError

    interrupted = _Interrupted()
    previous = {s: signal.signal(s, interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    workload_id = ""
    try:
        with Client() as pool:
            workload_id = pool.submit(spec)
            print(f"gpupool: allocation {workload_id} submitted", file=sys.stderr)
            said = ""
            while True:
                if interrupted.received is not None:
                    with contextlib.suppress(GpupoolError):
                        pool.cancel(workload_id)
                    print(f"gpupool: allocation {workload_id} cancelled", file=sys.stderr)
                    return 128 + interrupted.received
                workload = pool.workload(workload_id)
                if workload.status == "running":
                    break
                if workload.status in ("succeeded", "failed", "cancelled"):
                    return _error(f"allocation {workload_id} ended before it ran ({workload.status}: "
                                  f"{workload.message}).", 1)
                if workload.status == "pending" and workload.reason != said:
                    said = workload.reason
                    if said not in ("submitted", "released", "dependency_met"):
                        print(f"gpupool: {workload_id} pending: {said}: {workload.message}", file=sys.stderr)
                time.sleep(POLL_S)
            if not command and not interactive:
                print(workload_id)  # held for `gpupool exec`; `gpupool cancel` releases it
                return 0
            print(f"gpupool: allocation {workload_id} granted; it is released when "
                  f"{'the command' if command else 'the shell'} exits", file=sys.stderr)
    except GpupoolError as exc:
        return _error(exc.message, exc.exit_code)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    try:
        return exec_command(workload_id, command or SHELL, pty=interactive or (os.isatty(0) and os.isatty(1)))
    except GpupoolError as exc:
        return _error(exc.message, exc.exit_code)
    finally:
        with contextlib.suppress(GpupoolError), Client() as pool:
            pool.cancel(workload_id)
        print(f"gpupool: allocation {workload_id} released", file=sys.stderr)
