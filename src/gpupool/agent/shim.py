"""The pod shim: a POSIX sh script that waits to be placed in the pod's cgroup, applies RLIMITs, runs
the command and records its exit status.

The runner starts it as `/bin/sh -c SCRIPT gpupool-shim EXIT_FD GO RLIMIT_DATA_KIB RLIMIT_NPROC
WORKDIR COMMAND...` (an empty string for what it does not use), as the leader of the pod's own process
group, already as the pod's Unix account (launcher.py drops privileges before exec) and with the
pod's environment only. EXIT_FD is a file descriptor open on the pod's exit file, which lives in the
agent's private state directory (the pod cannot reach it by its path); the shim writes the status
through /dev/fd/EXIT_FD (dash takes single-digit descriptors only in redirections), so the file
belongs to the pod's account. When the pod has a cgroup, GO is non-empty and the shim's standard
input is the read end of a pipe: the runner moves the shim into the cgroup (a pod's account may not
write cgroup.procs) and then writes one line, and only then does the shim start the command (with
/dev/null as its input), so no process of the pod runs outside its limits. A shim started through a
launcher helper always waits so: the runner writes its line only once the helper answered in time,
and a shim that reads end-of-file instead (the launch was given up, its helper replaced, or the
agent's process killed between saving the pod's process id and letting it go) records NEVER_STARTED
in its exit file and exits 125 without running anything. It enters WORKDIR itself,
as the pod's account, so a directory that account may not enter fails the pod instead of being
entered with the agent's rights. It was a `python -I -S` script; a shell costs about 1 ms of CPU to
start where Python costs 20-60 ms, which bounded how many short pods a node could run per second.
Everything it runs is a shell builtin (no fork beyond the command itself). Its `ulimit` sets the
soft and the hard limit, and it runs as the pod's account, so the pod cannot raise them again;
RLIMIT_NPROC is `ulimit -p` in dash and `ulimit -u` in bash, so it tries both and says on the pod's
stderr when neither took.

It survives the group-wide SIGTERM that cancels a pod (a trap with an action, so the command gets the
default disposition back on exec), so it can write the command's exit status to a file the runner
reads even after an agent restart. The command is forked before the traps are set, as an
asynchronous list the shim `wait`s for: a child forked while a trap is set carries the shell's
handler until it execs, so a SIGTERM landing in that window would be swallowed and the pod killed
only after its grace period (a shell also defers a trap until a foreground command ends; a `wait`
returns on it). A SIGTERM that reaches the shim before its trap is set ends it with the command; the
runner then records the stop without an exit file. Like every asynchronous command of a
non-interactive shell, the command starts with SIGINT and SIGQUIT ignored; pods are stopped with
SIGTERM. A SIGKILL takes it down with the group; the runner then knows it
sent that signal. A shell reports a command killed by signal N as status 128+N, so a command that
itself exits with 129-192 is recorded as killed by that signal (the pod fails either way).

The exit status is written with one `printf` (a single small write) and read only after the shim has
exited, so the reader never sees half of it; it is not fsynced (see docs/isolation.md: the store is
the source of truth, and a power loss marks such pods lost rather than running them twice).
"""

from __future__ import annotations

from collections.abc import Sequence

SHELL = "/bin/sh"

NEVER_STARTED = "never started: the agent ended before letting the command run"
"""The exit file's message of a shim that read end-of-file where it waited to be let go: the agent
(a server's process, killed) never told it to run the command, so nothing of the pod ran."""

SCRIPT = r"""
exit_fd=$1 go=$2 rlimit_kib=$3 nproc=$4 workdir=$5
shift 5
record() { printf '{"exit_code": %d, "signal": %s, "message": "%s"}\n' "$1" "$2" "$3" > "/dev/fd/$exit_fd"; }
if [ -n "$go" ]; then
  if ! read -r joined; then
    record 125 null "NEVER_STARTED"
    exit 125
  fi
  exec < /dev/null
  [ "$joined" = ok ] || echo "gpupool: $joined" >&2
fi
if [ -n "$rlimit_kib" ]; then ulimit -d "$rlimit_kib"; fi
if [ -n "$nproc" ]; then
  { ulimit -p "$nproc" || ulimit -u "$nproc"; } 2>/dev/null ||
    echo "gpupool: could not limit this account's processes to $nproc; not enforced" >&2
fi
if ! cd -- "$workdir" 2>/dev/null; then
  echo "gpupool: cannot enter the working directory $workdir as $(id -un 2>/dev/null || id -u)" >&2
  record 126 null "cannot enter the working directory (missing, or not open to the pod's account)"
  exit 126
fi
if ! command -v "$1" > /dev/null 2>&1; then
  echo "gpupool: cannot start '$1': not found or not executable" >&2
  record 127 null "cannot start the command: not found or not executable"
  exit 127
fi
"$@" &
child=$!
trap 'woke=1' TERM INT HUP
while :; do
  woke=
  wait "$child"
  [ -n "$woke" ] || break
done
wait "$child"
rc=$?
if [ "$rc" -gt 128 ] && [ "$rc" -le 192 ]; then
  record "$rc" $((rc - 128)) "killed by SIG$(kill -l $((rc - 128)) 2>/dev/null || echo $((rc - 128)))"
else
  record "$rc" null "exited with code $rc"
fi
exit "$rc"
""".replace("NEVER_STARTED", NEVER_STARTED)


def shim_argv(exit_fd: int | str, command: Sequence[str], *, workdir: str, wait_for_go: bool = False,
              rlimit_data_bytes: int | None = None, rlimit_nproc: int | None = None) -> list[str]:
    """The argv that runs `command` under the shim (RLIMIT_DATA rounded down to KiB, at least 1;
    RLIMIT_NPROC at least 1)."""
    rlimit_kib = str(max(1, rlimit_data_bytes // 1024)) if rlimit_data_bytes else ""
    nproc = str(max(1, rlimit_nproc)) if rlimit_nproc else ""
    return [SHELL, "-c", SCRIPT, "gpupool-shim", str(exit_fd), "1" if wait_for_go else "",
            rlimit_kib, nproc, workdir, *command]
