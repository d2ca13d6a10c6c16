"""The pod shim: joins the pod's cgroup, applies RLIMITs, runs the command and records its exit status.

It is started by the runner as the leader of the pod's own process group and runs with `python -I -S`
(standard library only), so it costs little and ignores the pod's PYTHONPATH. It survives the
group-wide SIGTERM that cancels a pod (the command does not: it gets the default disposition back on
exec), so it can write the command's exit status to a file the runner reads even after an agent
restart. A SIGKILL takes it down with the group; the runner then knows it sent that signal.

Usage: python -I -S shim.py EXIT_FILE [--cgroup DIR] [--rlimit-data BYTES] -- COMMAND...
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys


def _write_exit(path: str, exit_code: int, signal_number: int | None, message: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({"exit_code": exit_code, "signal": signal_number, "message": message}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _parse(argv: list[str]) -> tuple[str, str | None, int | None, list[str]]:
    if "--" not in argv or argv.index("--") < 1:
        raise SystemExit("usage: shim.py EXIT_FILE [--cgroup DIR] [--rlimit-data BYTES] -- COMMAND...")
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    exit_file, cgroup, rlimit_data = options[0], None, None
    rest = options[1:]
    while rest:
        flag, value, rest = rest[0], rest[1], rest[2:]
        if flag == "--cgroup":
            cgroup = value
        elif flag == "--rlimit-data":
            rlimit_data = int(value)
    return exit_file, cgroup, rlimit_data, command


def main(argv: list[str]) -> int:
    exit_file, cgroup, rlimit_data, command = _parse(argv)
    if cgroup:
        try:
            with open(os.path.join(cgroup, "cgroup.procs"), "w", encoding="ascii") as handle:
                handle.write(str(os.getpid()))
        except OSError as exc:
            print(f"gpupool: could not join cgroup {cgroup} ({exc.strerror}); host limits not enforced",
                  file=sys.stderr, flush=True)
    if rlimit_data:
        resource.setrlimit(resource.RLIMIT_DATA, (rlimit_data, rlimit_data))
    stopping: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # A Python handler (not SIG_IGN) so the command gets the default disposition back on exec.
        signal.signal(signum, lambda number, _frame: stopping.append(number))
    if stopping:
        _write_exit(exit_file, 128 + stopping[0], stopping[0], "stopped before the command started")
        return 128 + stopping[0]
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        message = f"cannot start {command[0]!r}: {exc.strerror}"
        print(f"gpupool: {message}", file=sys.stderr, flush=True)
        _write_exit(exit_file, 127, None, message)
        return 127
    while True:
        try:
            returncode = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for safety
            continue
    if returncode < 0:
        name = signal.Signals(-returncode).name
        _write_exit(exit_file, 128 - returncode, -returncode, f"killed by {name}")
        return 128 - returncode
    _write_exit(exit_file, returncode, None, f"exited with code {returncode}")
    return returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
