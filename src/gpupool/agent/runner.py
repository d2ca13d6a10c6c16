"""Run pods as process groups: start, stream logs to files, stop (TERM then KILL), reap, re-adopt.

Each pod lives in STATE_DIR/pods/<pod_id>/ with state.json (written atomically), stdout.log,
stderr.log and exit.json (written by the shim through a descriptor the runner opened). The state
directory is the agent's alone (0700): a pod, started as its own Unix account (see identity.py),
cannot read or change it; the pod works in its private directory instead. A new Runner on the same
state directory re-adopts pods whose process still runs (same pid and same start time, so a reused
pid is never mistaken for ours) and reports the others finished (exit status from exit.json) or
lost, with the reason. Each log is held to `max_log_bytes` (see cap_log) and each exit file to a
record's size (cap_exit_file), so a pod's output cannot fill the agent's disk (what it writes
elsewhere is the disk guard's: diskguard.py). A pod's whole process tree
ends with it: its group, then what left the group (its cgroup, its marker, and for the pool's own
accounts every process of the account once no pod of it is live on the machine: leftovers.py).
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import logging
import os
import pwd
import re
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from gpupool.agent import podstate
from gpupool.agent.fencing import EpochFence
from gpupool.agent.identity import POD_GROUP, PodIdentity, is_own_account
from gpupool.agent.launcher import EXIT_FD_PLACEHOLDER, Launcher, launch_timeout_s
from gpupool.agent.leftovers import AccountLocks, agent_mark, kill_leftovers, pod_mark
from gpupool.agent.mounts import PodNamespace
from gpupool.agent.podstate import PodRecord
from gpupool.agent.shim import NEVER_STARTED, shim_argv
from gpupool.errors import GpupoolError, InvalidInput, NotFound, ProviderError
from gpupool.pods import LogChunk, PodPhase

log = logging.getLogger("gpupool.agent")
_POD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ESCALATION_POLL_S = 0.02
SWEEP_INTERVAL_S = 0.1
DEFAULT_MAX_LOG_BYTES = 2**30
"""What one pod's log (each of stdout.log and stderr.log) may hold; the output beyond is dropped."""


class LogStream(StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"
    NOTES = "notes"
    """What the agent says about the pod (where it runs and why), written at launch."""


@dataclass(frozen=True, slots=True)
class HostLimits:
    """Host limits for one pod: a prepared cgroup v2 directory to join, or an RLIMIT_DATA fallback,
    and the per-account process limit (RLIMIT_NPROC) its shim sets before starting the command."""

    cgroup_dir: Path | None = None
    rlimit_data_bytes: int | None = None
    rlimit_nproc: int | None = None


def _complete_utf8(data: bytes) -> bytes:
    """Drop a multi-byte character cut at the end, so the next read starts on its first byte."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte or ASCII
            need = 1 if byte < 0x80 else 2 if byte >= 0xC0 and byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if need <= back else data[:-back]
    return data


def cap_note(max_bytes: int) -> bytes:
    """The line that ends a log cut at its cap (on a line of its own)."""
    shown = f"{max_bytes / 2**30:g} GiB" if max_bytes >= 2**30 else (
        f"{max_bytes / 2**20:g} MiB" if max_bytes >= 2**20 else f"{max_bytes} bytes")
    return (f"\ngpupool: this log reached its cap of {shown}; the pod's further output here is dropped "
            "(the pool's --max-pod-log).\n").encode()


def _open_if_over(path: Path, max_bytes: int) -> int:
    """A read-write descriptor on the pod's file at `path` when it holds more than `max_bytes`, else
    -1 (the usual case: one stat; -1 too when it is not written yet, or gone)."""
    try:
        if os.stat(path, follow_symlinks=False).st_size <= max_bytes:
            return -1
        return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return -1


def cap_log(path: Path, max_bytes: int) -> bool:
    """Cut the log at `path` back to `max_bytes` followed by the cap's note when it holds more; True
    when it reached the cap. The pod writes with O_APPEND, so what it writes after a cut lands after
    the note and is cut at the next check: the log never holds more than the cap, the note and what
    the pod wrote since the last check."""
    fd = _open_if_over(path, max_bytes)
    if fd < 0:
        return False
    note = cap_note(max_bytes)
    try:
        size = os.fstat(fd).st_size
        if size != max_bytes + len(note) or os.pread(fd, len(note), max_bytes) != note:
            os.ftruncate(fd, max_bytes)
            os.pwrite(fd, note, max_bytes)
            os.ftruncate(fd, max_bytes + len(note))  # what the pod appended meanwhile goes too
        return True
    except OSError:
        log.warning("could not cut %s back to its cap", path, exc_info=True)
        return False
    finally:
        os.close(fd)


def cap_exit_file(path: Path) -> bool:
    """Empty the exit file at `path` when it holds more than a record can (`MAX_EXIT_FILE_BYTES`);
    True when it did. The shim runs as the pod's account, so the pod can write through the shim's
    descriptor (its own, or the shim's under /proc/PID/fd): what it writes is junk the reader refuses,
    and is cut at every check, as the logs are. The shim's own record opens the file anew, truncating."""
    fd = _open_if_over(path, podstate.MAX_EXIT_FILE_BYTES)
    if fd < 0:
        return False
    try:
        os.ftruncate(fd, 0)
        return True
    except OSError:
        log.warning("could not empty %s", path, exc_info=True)
        return False
    finally:
        os.close(fd)


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def _join_cgroup(limits: HostLimits, pid: int, go_w: int) -> None:
    """Move the shim into the pod's cgroup, then let it start the command (one line on its pipe:
    'ok', or why the limits do not hold, which the shim writes to the pod's stderr)."""
    assert limits.cgroup_dir is not None
    try:
        (limits.cgroup_dir / "cgroup.procs").write_text(str(pid))
        answer = "ok"
    except OSError as exc:
        answer = f"could not join cgroup {limits.cgroup_dir} ({exc.strerror}); host limits not enforced"
    _go(go_w, answer)


def _go(go_w: int, answer: str) -> None:
    """Let the shim go on: one line ('ok', or why the limits do not hold), then close the pipe."""
    with contextlib.suppress(OSError):
        os.write(go_w, (answer + "\n").encode())
    os.close(go_w)


ACKNOWLEDGED = "acknowledged"
"""A file in a finished pod's directory once the server stored its end (`Runner.forget`)."""


def _final_phase(record: PodRecord, exit_code: int) -> PodPhase:
    if record.stop_requested_at_s is not None:
        return PodPhase.STOPPED
    return PodPhase.SUCCEEDED if exit_code == 0 else PodPhase.FAILED


def _read_log_file(record: PodRecord, path: Path, stream: LogStream, offset: int, max_bytes: int,
                   finished: bool) -> LogChunk:
    """Runner.read_log's text of the log at `path` (`finished`: whether the pod has ended)."""
    if stream is LogStream.STDERR and record.combined_output:
        raise InvalidInput(f"Pod {record.pod_id}'s stderr is in its output log with stdout, in the order "
                           "written; submit with --separate-stderr to keep it apart.")
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if not 0 <= offset <= size:  # never seek past the end (a filesystem may refuse it)
                # asked from past the end (or a log cut back to its cap): resume at the end
                return LogChunk("", size, finished)
            handle.seek(offset)
            data = handle.read(max_bytes)
            at_end = not handle.read(1)
    except FileNotFoundError:
        return LogChunk("", max(0, offset), finished)
    data = data if (finished and at_end) else _complete_utf8(data)
    return LogChunk(data.decode("utf-8", errors="replace"), offset + len(data), finished and at_end)


def read_pod_log(state_dir: Path, pod_id: str, stream: LogStream | str = LogStream.STDOUT, offset: int = 0,
                 max_bytes: int = 1 << 20) -> LogChunk:
    """The log of a pod that another process's runner keeps in `state_dir` (an actor-carried pod's,
    read by its node's agent), as Runner.read_log answers it, without a Runner there: one would
    re-adopt the pod and write its record, and a record saved before the pod's process exists
    (Runner.start) would end LOST, its cgroup removed, while the other runner starts the pod. The
    record is only read; the log is finished once it says the pod ended or its process is gone.
    Raises NotFound for a pod without a record there, InvalidInput as Runner.read_log does."""
    try:
        stream = LogStream(stream)
    except ValueError:
        raise InvalidInput(f"Unknown log stream {stream!r}; use 'stdout', 'stderr' or 'notes'.") from None
    path = Path(state_dir) / "pods" / pod_id
    if not _POD_ID.match(pod_id) or not (path / "state.json").exists():
        raise NotFound(f"No pod {pod_id!r} on this node.", pod_id=pod_id)
    record = podstate.load_record(path / "state.json")
    if isinstance(record, str):  # unreadable: lost, as a runner re-adopting it would say
        record = PodRecord(pod_id=pod_id, command=[], workdir="", phase=PodPhase.LOST, message=record)
    finished = record.finished or (record.pid is not None
                                   and not podstate.process_alive(record.pid, record.start_ticks))
    return _read_log_file(record, path / f"{stream.value}.log", stream, offset, max_bytes, finished)


class Runner:
    """Starts and supervises pods on this machine. Thread-safe; every method returns promptly."""

    def __init__(self, state_dir: Path, *, clock: Callable[[], float] = time.time,
                 max_log_bytes: int = DEFAULT_MAX_LOG_BYTES,
                 account_locks: AccountLocks | None = None) -> None:
        self._dir = Path(state_dir) / "pods"
        self.max_log_bytes = max_log_bytes
        """Each log of a pod is cut back to this (and a note saying so) at every poll and at its end."""
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self._dir, 0o700)
        self.mark = agent_mark(Path(state_dir))
        """This agent's part of its pods' marker (leftovers.py): another agent's sweep passes them by."""
        self._clock = clock
        self._lock = threading.RLock()
        self._records: dict[str, PodRecord] = {}
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._timers: dict[str, threading.Timer] = {}
        self._spawning: set[str] = set()
        """Pods whose process is being started (outside the lock): not reaped until it exists."""
        self._final_copies: dict[str, PodRecord] = {}
        """Copies of finished records (they never change again), so poll() costs O(running pods)."""
        self._listed: dict[str, PodRecord] = {}
        """The records poll() returns: every pod but the finished ones forget() acknowledged."""
        self._dormant: set[str] = set()
        """Finished pods acknowledged before this runner started (ACKNOWLEDGED in their directory):
        their records are read from disk only when asked for (`_record`), so opening a node that has
        run many pods costs what its live pods cost."""
        self._exit_listeners: list[Callable[[], None]] = []
        self._unsaved: set[str] = set()
        """Finished pods whose final record could not be written (a full disk): saved at a later poll."""
        self._failing: set[str] = set()
        """Pods `fail` ended, until they are reaped."""
        self._to_sweep: dict[str, tuple[int, str | None]] = {}
        """Pods reaped whose leftovers outside their process group are still to be killed."""
        self._accounts = account_locks if account_locks is not None else (
            AccountLocks() if os.geteuid() == 0 else None)
        """Marks the pool accounts with a live pod here, for the sweeps by uid (leftovers.py)."""
        self._accounts_to_sweep: set[int] = set()
        self._last_sweep_s = float("-inf")
        self._sweep_now = False
        self._reaper: _Reaper | None = None
        self._launcher: Launcher | None = None
        """Started at the first pod that runs as another account (see launcher.py)."""
        self._launch_timeout_s = launch_timeout_s()
        self.fence = EpochFence(Path(state_dir))
        """The newest leader epoch announced to this node (fencing.py)."""
        self._readopt()
        self._sweep(force=True)

    # ---- paths and persistence -------------------------------------------------------------
    def pod_dir(self, pod_id: str) -> Path:
        return self._dir / pod_id

    def log_path(self, pod_id: str, stream: LogStream | str = LogStream.STDOUT) -> Path:
        return self.pod_dir(pod_id) / f"{LogStream(stream).value}.log"

    def _save(self, record: PodRecord) -> None:
        podstate.save_record(self.pod_dir(record.pod_id) / "state.json", record)

    # ---- start -----------------------------------------------------------------------------
    def start(self, pod_id: str, command: Sequence[str], *, env: Mapping[str, str], workdir: str | Path = "",
              limits: HostLimits = HostLimits(), identity: PodIdentity | None = None,
              combined_output: bool = False, netns: str = "",
              namespace: PodNamespace | None = None, epoch: int | None = None, net: str = "") -> PodRecord:
        """Start `command` as a new process group and return at once, with exactly `env` as its
        environment and, given an `identity`, as that Unix account (no supplementary groups, no new
        privileges). With `combined_output`, stdout and stderr go to one log (stdout.log), in the
        order written, as sbatch does without --error. With `netns` (and an `identity`: only the
        launcher helper can join it), inside that network namespace; `net`, the namespace's attachment
        (netns.PodNet as JSON), is kept in the pod's record. Idempotent by pod_id: a known
        pod is returned unchanged. Raises InvalidInput for a bad pod id, command or workdir. With an
        `epoch` (a leader's, fencing.py), the command runs only if no newer leader took over
        before it was let go; otherwise its record ends failed and ProviderError says why."""
        if not _POD_ID.match(pod_id):
            raise InvalidInput(f"Pod id {pod_id!r} must be 1-128 letters, digits, '.', '_' or '-'.")
        if not command:
            raise InvalidInput(f"Pod {pod_id!r} has an empty command; give the program to run.")
        if netns and identity is None:
            raise InvalidInput(f"Pod {pod_id!r}: a network namespace needs a pod account to run as.")
        if namespace is not None and identity is None:
            raise InvalidInput(f"Pod {pod_id!r}: mounts and secret files need a pod account to run as.")
        with self._lock:
            known = self._record(pod_id)
            if known is not None:
                return known
            pod_dir = self.pod_dir(pod_id)
            pod_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            cwd = Path(workdir) if workdir else pod_dir
            # As another account, only the shim's `cd` as that account judges the directory: a check
            # here, as root, would tell a tenant which paths exist where it may not look.
            if identity is None and not cwd.is_dir():
                raise InvalidInput(f"Pod {pod_id!r}: working directory {str(cwd)!r} does not exist.")
            record = PodRecord(pod_id=pod_id, command=list(command), workdir=str(cwd),
                               started_at_s=self._clock(), uid=identity.uid if identity else None,
                               combined_output=combined_output,
                               cgroup=str(limits.cgroup_dir) if limits.cgroup_dir else None,
                               epoch=epoch, net=net)
            self._save(record)  # before the process exists: a crash here leaves a record, not a stray
            self._records[pod_id] = self._listed[pod_id] = record
            self._spawning.add(pod_id)
        try:  # outside the lock, so several pods can be started at once
            if identity is not None and self._sweepable(identity.uid):
                assert self._accounts is not None
                try:
                    self._accounts.hold(identity.uid)  # waits while a sweep of the account runs
                except OSError as exc:
                    with self._lock:
                        self._finish(record, PodPhase.FAILED, 127, None,
                                     f"cannot mark the pod's account in use: {exc.strerror}")
                    return record
            marked = {**env, **pod_mark(self.mark, pod_id)}
            self._spawn(record, marked, limits, identity, netns, namespace)
        finally:
            with self._lock:
                self._spawning.discard(pod_id)
        return record

    def _spawn(self, record: PodRecord, env: dict[str, str], limits: HostLimits,
               identity: PodIdentity | None, netns: str = "",
               namespace: PodNamespace | None = None) -> None:
        pod_dir = self.pod_dir(record.pod_id)
        exit_fd = os.open(pod_dir / "exit.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        # The shim waits for one line before it runs the command: to be moved into its cgroup, and,
        # started through a helper, to be told the launch was answered in time (launcher.py).
        # A leader's launch (an epoch) waits for it too: to be refused if a newer leader took over.
        go_r, go_w = (os.pipe() if limits.cgroup_dir or identity is not None or record.epoch is not None
                      else (-1, -1))
        child: subprocess.Popen[bytes] | None = None
        # A launcher helper has its own descriptor numbers: it puts the exit file's in for the token.
        argv = shim_argv(exit_fd if identity is None else EXIT_FD_PLACEHOLDER, record.command,
                         workdir=record.workdir, wait_for_go=go_r >= 0,
                         rlimit_data_bytes=limits.rlimit_data_bytes, rlimit_nproc=limits.rlimit_nproc)
        try:
            with contextlib.ExitStack() as files:
                out = files.enter_context(open(pod_dir / "stdout.log", "ab", opener=_private))
                err = out if record.combined_output else files.enter_context(  # one file: exact order
                    open(pod_dir / "stderr.log", "ab", opener=_private))
                if identity is not None:
                    os.fchown(exit_fd, identity.uid, identity.gid)  # the shim reopens it as the account
                    pid, start_ticks = self._launch_as(identity, argv, env, go_r, out.fileno(),
                                                       err.fileno(), exit_fd, netns, namespace)
                else:
                    stdin = go_r if go_r >= 0 else subprocess.DEVNULL
                    child = subprocess.Popen(argv, cwd="/", env=env, stdin=stdin, stdout=out, stderr=err,
                                             start_new_session=True, close_fds=True, pass_fds=(exit_fd,))
                    pid, start_ticks = child.pid, podstate.process_start_ticks(child.pid)
        except OSError as exc:
            if go_w >= 0:
                os.close(go_w)
            with self._lock:
                self._finish(record, PodPhase.FAILED, 127, None, f"cannot start the pod: {exc.strerror}")
            return
        except Exception as exc:  # the helper gone or late, or bad data: the pod never runs
            if go_w >= 0:
                os.close(go_w)  # a shim a replaced helper may still start reads EOF and runs nothing
            why = exc.message if isinstance(exc, GpupoolError) else type(exc).__name__
            with self._lock:
                self._finish(record, PodPhase.FAILED, None, None, f"not started: {why}")
            raise
        finally:
            os.close(exit_fd)
            if go_r >= 0:
                os.close(go_r)
        if record.epoch is not None:  # a leader's launch: fenced by its epoch (fencing.py)
            with self._lock:  # the process id on disk first: a takeover that reads the records after
                record.pid, record.start_ticks = pid, start_ticks  # this save adopts the pod
                self._save(record)
            newest = self.fence.newest()  # then the epoch: one announced before this read refuses it
            if newest > record.epoch:
                self._refuse_stale(record, go_w, child, newest)
        if go_w >= 0 and limits.cgroup_dir is not None:
            _join_cgroup(limits, pid, go_w)
        elif go_w >= 0:
            _go(go_w, "ok")
        if self._accounts is not None and identity is not None and self._sweepable(identity.uid):
            self._accounts.register(identity.uid, self._note_key(record.pod_id), pid, start_ticks)
        with self._lock:
            record.pid, record.start_ticks = pid, start_ticks
            record.phase = PodPhase.RUNNING
            if child is not None:
                self._children[record.pod_id] = child
            self._save(record)
            if record.stop_requested_at_s is not None:  # stopped while it was being started
                self._signal_group(record, signal.SIGTERM)
            reaper = self._reaper
            if reaper is None and _Reaper.supported():
                reaper = self._reaper = _Reaper(self._reap_exited)
        if reaper is not None:
            reaper.watch(record.pod_id, pid)

    def launcher(self) -> Launcher:
        """The launcher helpers (started on first use): execs into pods are started through them too."""
        with self._lock:
            if self._launcher is None:
                self._launcher = Launcher(self._launch_timeout_s)
            return self._launcher

    def _refuse_stale(self, record: PodRecord, go_w: int, child: subprocess.Popen[bytes] | None,
                      newest: int) -> None:
        """A launch decided under an epoch older than the newest leader's: its shim reads end of file
        and runs nothing; the record ends failed; ProviderError tells the (deposed) caller."""
        os.close(go_w)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)  # the shim exits at once on end of file
        why = (f"refused: launched under leader epoch {record.epoch}, but the leader at epoch {newest} "
               "has taken over since; the new leader places the workload itself")
        with self._lock:  # never started: the new leader, which may have read this record with its
            record.never_started = True  # process id, requeues the workload
            self._finish(record, PodPhase.LOST, None, None, why)
        raise ProviderError(f"Pod {record.pod_id} {why}.", pod_id=record.pod_id)

    def _launch_as(self, identity: PodIdentity, argv: list[str], env: Mapping[str, str], go_r: int,
                   stdout: int, stderr: int, exit_fd: int, netns: str = "",
                   namespace: PodNamespace | None = None) -> tuple[int, int | None]:
        """Start the shim as `identity` through the launcher helper (see launcher.py); the exit
        file's descriptor number is the helper's, so argv names it by a placeholder."""
        with self._lock:
            if self._launcher is None:
                self._launcher = Launcher(self._launch_timeout_s)
            launcher = self._launcher
        devnull = os.open(os.devnull, os.O_RDONLY) if go_r < 0 else -1
        try:
            return launcher.launch(argv, env, identity, stdin=go_r if go_r >= 0 else devnull,
                                   stdout=stdout, stderr=stderr, exit_fd=exit_fd, netns=netns,
                                   namespace=namespace)
        finally:
            if devnull >= 0:
                os.close(devnull)

    # ---- stop ------------------------------------------------------------------------------
    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        """SIGTERM the pod's whole process group now and SIGKILL it after `grace_s`. Returns at
        once; idempotent; unknown or finished pods are ignored."""
        with self._lock:
            record = self._record(pod_id)
            if record is None or record.finished or record.stop_requested_at_s is not None:
                return
            now = self._clock()
            record.stop_requested_at_s = now
            record.kill_deadline_s = now + max(0.0, grace_s)
            self._save(record)
            self._signal_group(record, signal.SIGTERM)
            timer = threading.Timer(max(0.0, grace_s), self._escalate, args=(pod_id,))
            timer.daemon = True
            self._timers[pod_id] = timer
            timer.start()

    def fail(self, pod_id: str, reason: str) -> bool:
        """End a running pod at once (SIGKILL to its group; what left it goes at its reap, as for any
        end) because of what the agent found on its own (diskguard.py): it ends FAILED, `reason`
        first in its message, whatever its command would have returned. False for an unknown pod,
        one that ended or is ending, or one whose process does not exist yet."""
        with self._lock:
            record = self._record(pod_id)
            if record is None or record.finished or record.pid is None or pod_id in self._failing:
                return False
            self._failing.add(pod_id)
            record.message = reason if not record.message else f"{reason}; {record.message}"
            self._sweep_now = True
            try:  # before the kill: a restart finds the reason (but the disk may be full)
                self._save(record)
            except OSError as exc:
                log.warning("pod %s: could not save its record (%s); saved at its end", pod_id, exc.strerror)
            self._signal_group(record, signal.SIGKILL)
            return True

    def when_idle(self, uid: int, action: Callable[[], object]) -> bool:
        """Run `action` once no pod or process of the pool's account `uid` is left on this machine
        (leftovers.AccountLocks.when_idle); False, running nothing, for another account or while one is."""
        if self._accounts is None or not self._sweepable(uid):
            return False
        with self._lock:
            if uid in self._live_uids():
                return False
        return self._accounts.when_idle(uid, action)

    def _signal_group(self, record: PodRecord, signum: signal.Signals) -> None:
        if record.pid is None or not self._alive(record):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, signum)

    def _escalate(self, pod_id: str) -> None:
        with self._lock:
            record = self._records.get(pod_id)
            if record is not None and not record.finished:
                self._signal_group(record, signal.SIGKILL)
        self.poll()

    # ---- poll / reap -----------------------------------------------------------------------
    def _alive(self, record: PodRecord) -> bool:
        child = self._children.get(record.pod_id)
        if child is not None:
            return child.poll() is None
        return record.pid is not None and podstate.process_alive(record.pid, record.start_ticks)

    def known(self, pod_id: str) -> PodRecord | None:
        """A copy of the pod's record as last seen (no reaping), or None for an unknown pod."""
        with self._lock:
            record = self._record(pod_id)
            return None if record is None else record.model_copy()

    def add_exit_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` (from the reaper thread) after pods this runner started have exited and
        been reaped; poll() then reports them finished."""
        self._exit_listeners.append(listener)

    def _reap_exited(self, pod_ids: Sequence[str]) -> None:
        """The reaper thread's work: what poll() would do for these pods, as soon as they exit, so
        the state file writes of a finish are off the poller's path."""
        reaped = False
        with self._lock:
            for pod_id in pod_ids:
                record = self._records.get(pod_id)
                if record is None or record.finished or pod_id in self._spawning or self._alive(record):
                    continue
                self._reap(record)
                reaped = True
        self._sweep()
        if reaped:
            for listener in self._exit_listeners:
                listener()

    def _note_key(self, pod_id: str) -> str:
        """The name of a pod's note among the account's live pods (leftovers.AccountLocks): unique
        across the agents of this machine, whose pod ids may coincide."""
        return hashlib.sha256(str(self.pod_dir(pod_id)).encode()).hexdigest()[:32]

    def _sweepable(self, uid: int | None) -> bool:
        """Whether every process of `uid` may be killed once no pod of it is live: one of the pool's
        own accounts, as identity.ensure_account makes them (named gpupool-..., primary group
        gpupool-pods), never root, this agent's user, or another account mapped with --unix-user."""
        if self._accounts is None or uid is None or uid == 0 or uid == os.geteuid():
            return False
        try:
            entry = pwd.getpwuid(uid)
            group = grp.getgrnam(POD_GROUP).gr_gid
        except KeyError:
            return False
        return is_own_account(entry, group)

    def _live_uids(self) -> set[int | None]:
        return {r.uid for r in self._listed.values() if not r.finished}  # a forgotten pod has ended

    def _sweep(self, *, force: bool = False) -> None:
        """Kill what reaped pods left outside their group: not under the lock (it reads /proc), and
        at most once per SWEEP_INTERVAL_S unless forced, so a burst of short pods shares one pass.
        poll() runs often while pods run (and at every control loop interval), so a leftover lives
        at most about that long after its pod."""
        now = time.monotonic()
        with self._lock:
            due = force or self._sweep_now or now - self._last_sweep_s >= SWEEP_INTERVAL_S
            if not (self._to_sweep or self._accounts_to_sweep) or not due:
                return
            pods, self._to_sweep, self._last_sweep_s, self._sweep_now = self._to_sweep, {}, now, False
            live = self._live_uids()
            idle, self._accounts_to_sweep = self._accounts_to_sweep - live, set()
        if pods:
            kill_leftovers(pods, self.mark)
        for uid in idle:
            assert self._accounts is not None
            # released first: sweep() then runs only if no other agent has a live pod of it either
            with self._lock:
                if uid in self._live_uids():  # a pod of it started meanwhile: its end sweeps
                    continue
                self._accounts.release(uid)
            self._accounts.sweep(uid)

    def poll(self) -> list[PodRecord]:
        """Reap finished pods, escalate overdue stops, and return a copy of every record not
        forgotten (a finished pod's copy is made once and shared by later polls: treat the records
        as read-only)."""
        try:
            records = self._poll()
            self._cap_logs(r for r in records if not r.finished)
            return records
        finally:
            self._sweep()
            if self._launcher is not None:
                self._launcher.drain()  # read the helpers' exit reports, so none fills a socket

    def _poll(self) -> list[PodRecord]:
        with self._lock:
            if self._unsaved:
                self._save_unsaved()
            now = self._clock()
            copies = []
            for pod_id, record in self._listed.items():
                final = self._final_copies.get(pod_id)
                if final is not None:
                    copies.append(final)
                    continue
                if not record.finished:
                    if pod_id in self._spawning or self._alive(record):
                        if record.kill_deadline_s is not None and now >= record.kill_deadline_s:
                            self._signal_group(record, signal.SIGKILL)
                        copies.append(record.model_copy())
                        continue
                    self._reap(record)
                final = self._final_copies[pod_id] = record.model_copy()
                copies.append(final)
            return copies

    def forget(self, pod_ids: Iterable[str]) -> None:
        """Stop returning these finished pods from poll() (their final state is stored elsewhere);
        their records stay, so logs, get() and idempotent starts still know them. A pod that has not
        finished, or an unknown id, is ignored. Marked on disk too (ACKNOWLEDGED), so a runner opened
        again over this directory (a restart, a new leader's takeover) does not read them back."""
        forgotten = []
        with self._lock:
            for pod_id in pod_ids:
                record = self._listed.get(pod_id)
                if record is not None and record.finished:
                    del self._listed[pod_id]
                    self._final_copies.pop(pod_id, None)
                    forgotten.append(pod_id)
        for pod_id in forgotten:
            with contextlib.suppress(OSError):
                os.close(os.open(self.pod_dir(pod_id) / ACKNOWLEDGED,
                                 os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))

    def _record(self, pod_id: str) -> PodRecord | None:
        """The pod's record (under the lock), read from disk the first time for a dormant one."""
        record = self._records.get(pod_id)
        if record is None and pod_id in self._dormant:
            self._dormant.discard(pod_id)
            loaded = podstate.load_record(self.pod_dir(pod_id) / "state.json")
            record = loaded if not isinstance(loaded, str) else PodRecord(
                pod_id=pod_id, command=[], workdir="", phase=PodPhase.LOST, message=loaded)
            self._records[pod_id] = record
        return record

    def _cap_logs(self, records: Iterable[PodRecord]) -> None:
        """Hold each log of these pods to max_log_bytes (see cap_log), and each exit file to one
        record's size (see cap_exit_file)."""
        for record in records:
            cap_exit_file(self.pod_dir(record.pod_id) / "exit.json")
            for stream in (LogStream.STDOUT,) if record.combined_output else (LogStream.STDOUT,
                                                                              LogStream.STDERR):
                cap_log(self.log_path(record.pod_id, stream), self.max_log_bytes)

    def _reap(self, record: PodRecord) -> None:
        child = self._children.pop(record.pod_id, None)
        if record.pid is not None:
            # The pod ends with its main process: whatever it left in its group goes too, and what
            # left the group (setsid) but is still the pod's (its cgroup, or its marker), swept by
            # the caller outside the lock, in one pass over /proc for all pods reaped together.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.pid, signal.SIGKILL)
            uid = os.geteuid() if record.uid is None else record.uid
            self._to_sweep[record.pod_id] = (uid, record.cgroup)
            if record.stop_requested_at_s is not None:
                self._sweep_now = True  # a cancel or preemption is rare: its leftovers go at once
        status = podstate.read_exit_file(self.pod_dir(record.pod_id) / "exit.json")
        if status == (125, None, NEVER_STARTED) and record.phase is PodPhase.STARTING:
            # its shim was never let go (the agent saves RUNNING right after it does): nothing ran
            record.never_started = True
            self._finish(record, PodPhase.LOST, None, None, NEVER_STARTED)
            return
        if status is not None:
            code, sig, message = status
        elif (returncode := self._returncode(record, child)) is not None and returncode < 0:
            sig = -returncode
            code, message = 128 + sig, f"killed by {signal.Signals(sig).name}"
        elif returncode is not None:
            code, sig, message = returncode, None, f"exited with code {returncode}"
        elif record.kill_deadline_s is not None and self._clock() >= record.kill_deadline_s:
            code, sig, message = 137, int(signal.SIGKILL), "killed by SIGKILL after the grace period"
        elif record.stop_requested_at_s is not None:
            code, sig, message = 143, int(signal.SIGTERM), "ended after SIGTERM (exit status not recorded)"
        else:
            self._finish(record, PodPhase.LOST, None, None,
                         "the process ended while the agent was down and left no exit status")
            return
        self._finish(record, _final_phase(record, code), code, sig, message)

    def _returncode(self, record: PodRecord, child: subprocess.Popen[bytes] | None) -> int | None:
        """The shim's own exit status, as Popen reports it, when this runner started it."""
        if child is not None:
            return child.returncode
        if self._launcher is not None and record.pid is not None:
            return self._launcher.returncode(record.pid)
        return None

    def _finish(self, record: PodRecord, phase: PodPhase, code: int | None, sig: int | None,
                message: str) -> None:
        record.phase, record.exit_code, record.signal = phase, code, sig
        record.message = message if not record.message else f"{record.message}; {message}"
        record.finished_at_s = self._clock()
        self._failing.discard(record.pod_id)
        self._cap_logs((record,))  # what it wrote since the last poll
        timer = self._timers.pop(record.pod_id, None)
        if timer is not None:
            timer.cancel()
        if record.cgroup:
            with contextlib.suppress(OSError):
                Path(record.cgroup).rmdir()
        if record.uid is not None and self._sweepable(record.uid):
            self._accounts_to_sweep.add(record.uid)  # swept (and let go) once its last pod here ends
            if self._accounts is not None:
                self._accounts.unregister(record.uid, self._note_key(record.pod_id))
        try:
            self._save(record)
        except OSError as exc:  # its disk is full: the end is kept here, and saved at a later poll
            log.warning("pod %s ended, but its record could not be saved (%s); trying again at each poll",
                        record.pod_id, exc.strerror)
            self._unsaved.add(record.pod_id)

    def _save_unsaved(self) -> None:
        """Save the ends that could not be saved when they happened (under the lock)."""
        for pod_id in list(self._unsaved):
            record = self._records.get(pod_id)
            try:
                if record is not None:
                    self._save(record)
            except OSError:
                return  # still full: the next poll tries again
            self._unsaved.discard(pod_id)

    # ---- restart ---------------------------------------------------------------------------
    def _readopt(self) -> None:
        with os.scandir(self._dir) as entries:
            names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        states = []
        base = os.fspath(self._dir)  # plain strings: a node keeps thousands of pod directories
        for name in names:
            if os.path.exists(f"{base}/{name}/{ACKNOWLEDGED}"):  # only a saved, finished record is
                self._dormant.add(name)  # acknowledged: its end is stored; read only when asked for
            elif not os.path.exists(f"{base}/{name}/state.json"):
                # made by `start` just before a crash, before its record was saved: nothing ran
                # there and no one knows the pod, which its scheduler will place again
                shutil.rmtree(f"{base}/{name}", ignore_errors=True)
            else:
                states.append(self._dir / name / "state.json")
        for state in states:
            loaded = podstate.load_record(state)
            if isinstance(loaded, str):
                pod_id = state.parent.name
                loaded = PodRecord(pod_id=pod_id, command=[], workdir="", phase=PodPhase.LOST,
                                   message=loaded)
                self._records[pod_id] = self._listed[pod_id] = loaded
                continue
            record = loaded
            self._records[record.pod_id] = self._listed[record.pod_id] = record
            if record.finished:
                continue
            if record.pid is None:
                self._finish(record, PodPhase.LOST, None, None, "the agent stopped while starting the pod")
            elif podstate.process_alive(record.pid, None) and not podstate.process_alive(
                record.pid, record.start_ticks
            ):
                self._finish(record, PodPhase.LOST, None, None,
                             f"pid {record.pid} now belongs to another process")
            elif podstate.process_alive(record.pid, record.start_ticks):
                if self._accounts is not None and self._sweepable(record.uid):
                    assert record.uid is not None
                    self._accounts.hold(record.uid)
                    self._accounts.register(record.uid, self._note_key(record.pod_id), record.pid,
                                            record.start_ticks)
                # not saved now: both fields only inform, any later re-adoption sets them again, and
                # the record's next change saves them (a write per pod here was most of a takeover's
                # re-adoption: bench/failover.py)
                record.adopted = True
                record.message = "re-adopted after an agent restart"
            else:
                self._reap(record)
        for record in self._records.values():
            if not record.finished and record.kill_deadline_s is not None:
                delay = max(0.0, record.kill_deadline_s - self._clock())
                timer = threading.Timer(delay, self._escalate, args=(record.pod_id,))
                timer.daemon = True
                self._timers[record.pod_id] = timer
                timer.start()

    # ---- queries ---------------------------------------------------------------------------
    def get(self, pod_id: str) -> PodRecord:
        """The pod's current record (after a poll). Raises NotFound for an unknown pod."""
        self.poll()
        with self._lock:
            record = self._record(pod_id)
            if record is None:
                raise NotFound(f"No pod {pod_id!r} on this node.", pod_id=pod_id)
            return record.model_copy()

    def wait(self, pod_id: str, timeout_s: float) -> PodRecord:
        """Block until the pod has finished or `timeout_s` has passed; returns its record."""
        deadline = time.monotonic() + timeout_s
        while True:
            record = self.get(pod_id)
            if record.finished or time.monotonic() >= deadline:
                return record
            time.sleep(_ESCALATION_POLL_S)

    def read_log(self, pod_id: str, stream: LogStream | str = LogStream.STDOUT, offset: int = 0,
                 max_bytes: int = 1 << 20) -> LogChunk:
        """Log text from byte `offset`; non-blocking. Raises NotFound for an unknown pod and
        InvalidInput for an unknown stream name."""
        try:
            stream = LogStream(stream)
        except ValueError:
            raise InvalidInput(f"Unknown log stream {stream!r}; use 'stdout', 'stderr' or 'notes'.") from None
        record = self.get(pod_id)
        path = self.log_path(pod_id, stream)
        return _read_log_file(record, path, stream, offset, max_bytes, record.finished)

    def follow_log(self, pod_id: str, stream: LogStream | str = LogStream.STDOUT, *, offset: int = 0,
                   poll_s: float = 0.05, timeout_s: float | None = None) -> Iterator[str]:
        """Yield log text as it is written until the pod ends (or `timeout_s` passes)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            chunk = self.read_log(pod_id, stream, offset)
            offset = chunk.next_offset
            if chunk.text:
                yield chunk.text
            if chunk.finished or (deadline is not None and time.monotonic() >= deadline):
                return
            if not chunk.text:
                time.sleep(poll_s)

    def close(self, *, stop_pods: bool = False, grace_s: float = 5.0) -> None:
        """Stop the escalation timers; pods keep running for the next agent to re-adopt unless
        `stop_pods`, in which case they are stopped and this blocks until they are reaped."""
        if stop_pods:
            with self._lock:
                running = [r.pod_id for r in self._listed.values() if not r.finished]
            for pod_id in running:
                self.stop(pod_id, grace_s)
            for pod_id in running:
                self.wait(pod_id, grace_s + 5.0)
        self._sweep(force=True)
        with self._lock:
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()
            reaper, self._reaper = self._reaper, None
            launcher, self._launcher = self._launcher, None
        if self._accounts is not None:
            self._accounts.release_all()  # a runner that re-adopts the pods left running marks them again
        if reaper is not None:
            reaper.stop()
        if launcher is not None:
            launcher.close()


class _Reaper:
    """One thread that waits on the pidfds of the pods' main processes and hands the pods whose
    process exited to `on_exit` (Linux >= 5.3; without pidfds, poll() alone reaps, as before)."""

    def __init__(self, on_exit: Callable[[Sequence[str]], None]) -> None:
        self._on_exit = on_exit
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="gpupool-reaper", daemon=True)
        self._thread.start()

    @staticmethod
    def supported() -> bool:
        return hasattr(os, "pidfd_open")

    def watch(self, pod_id: str, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # already reaped by a poll (or no pidfd support here): poll() has it
            return
        with self._lock:
            if self._stopping:
                os.close(fd)
                return
            self._selector.register(fd, selectors.EVENT_READ, pod_id)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _run(self) -> None:
        try:
            while True:
                ready = self._selector.select()
                exited: list[str] = []
                with self._lock:
                    if self._stopping:
                        return
                    for key, _ in ready:
                        if key.data is None:
                            continue
                        self._selector.unregister(key.fd)
                        os.close(key.fd)
                        exited.append(key.data)
                if exited:
                    try:
                        self._on_exit(exited)
                    except Exception:  # poll() reaps whatever this could not
                        log.exception("reaping %d pod(s) failed", len(exited))
        finally:
            with self._lock:
                for key in list(self._selector.get_map().values()):
                    if key.data is not None:
                        os.close(key.fd)
                self._selector.close()

