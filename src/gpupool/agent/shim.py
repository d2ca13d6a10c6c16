"""The pod shim: a POSIX sh script that joins the pod's cgroup, applies RLIMITs, runs the command and
records its exit status.

The runner starts it as `/bin/sh -c SCRIPT gpupool-shim EXIT_FILE CGROUP_DIR RLIMIT_DATA_KIB COMMAND...`
(empty strings for the limits it does not apply), as the leader of the pod's own process group. It
was a `python -I -S` script; a shell costs about 1 ms of CPU to start where Python costs 20-60 ms,
which bounded how many short pods a node could run per second. Everything it runs is a shell builtin
(no fork beyond the command itself).

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

The exit file is written with one `printf` (a single small write) and read only after the shim has
exited, so the reader never sees half of it; it is not fsynced (see docs/isolation.md: the store is
the source of truth, and a power loss marks such pods lost rather than running them twice).
"""

from __future__ import annotations

from collections.abc import Sequence

SHELL = "/bin/sh"

SCRIPT = r"""
exit_file=$1 cgroup=$2 rlimit_kib=$3
shift 3
if [ -n "$cgroup" ]; then
  { echo $$ > "$cgroup/cgroup.procs"; } 2>/dev/null ||
    echo "gpupool: could not join cgroup $cgroup; host limits not enforced" >&2
fi
if [ -n "$rlimit_kib" ]; then ulimit -d "$rlimit_kib"; fi
record() { printf '{"exit_code": %d, "signal": %s, "message": "%s"}\n' "$1" "$2" "$3" > "$exit_file"; }
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
"""


def shim_argv(exit_file: str, command: Sequence[str], *, cgroup_dir: str = "",
              rlimit_data_bytes: int | None = None) -> list[str]:
    """The argv that runs `command` under the shim (RLIMIT_DATA rounded down to KiB, at least 1)."""
    rlimit_kib = str(max(1, rlimit_data_bytes // 1024)) if rlimit_data_bytes else ""
    return [SHELL, "-c", SCRIPT, "gpupool-shim", exit_file, cgroup_dir, rlimit_kib, *command]
