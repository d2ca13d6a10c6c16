"""Epoch fencing at the node agent: the one component every leader's launches go through.

With several servers (`gpupool up --ha`) each launch carries the leader lease's epoch it was decided
under (`PodLaunch.epoch`). The agent keeps the newest epoch a leader announced at its takeover in
its directory (`epoch`), and a launch is let go (the shim told to run the command) only while its
epoch is not older than that one:

- `advance()`, a new leader's first act at takeover, writes its epoch, then the new leader reads
  the agent's records;
- a launch (agent/runner.py) first saves its record with the process id of its shim (forked and
  waiting on a pipe), then reads the epoch, and tells the shim to go only if it is not older.

Each side writes its own file before it reads the other's, so at least one sees the other: either
the launch read the old epoch, and then its record (process id included) was on disk before the new
epoch, so the new leader's read of the records finds it and the pod is adopted (its store row being
the `launching` one committed before the hand-over); or it read the new one and is refused: its
shim reads end of file and runs nothing, and the pod ends `never_started`, so a new leader that
adopted it places the workload again. No launch of an old epoch starts unknown to the new leader,
and the takeover never waits on a launch: a leader stopped (SIGSTOP) in the middle of one holds
nothing the new leader needs (its shim waits for it, and runs once, or never). The file's lock
orders takeovers among themselves, and the Ray actor carrier's launches (`admitting`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from gpupool.agent.podstate import write_atomic


class EpochFence:
    """The newest leader epoch this agent was told of, kept in `state_dir/epoch`."""

    def __init__(self, state_dir: Path) -> None:
        self._path = Path(state_dir) / "epoch"
        self._lock_path = Path(state_dir) / "epoch.lock"

    def newest(self) -> int:
        """The newest epoch announced (0: none yet)."""
        try:
            return int(self._path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    @contextlib.contextmanager
    def _locked(self, mode: int) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)  # releases the lock

    @contextlib.contextmanager
    def admitting(self) -> Iterator[int]:
        """Held by a launch from its check of the epoch until its pod was started or refused (the
        Ray actor carrier's, providers/ray/actor.py): yields the newest epoch; no takeover's
        `advance()` runs meanwhile."""
        with self._locked(fcntl.LOCK_SH):
            yield self.newest()

    def advance(self, epoch: int, confirm: Callable[[], None] | None = None) -> int:
        """A new leader's takeover: from now on launches of an older epoch are refused. With
        `confirm` (called under the lock; it raises when
        `epoch` is no longer the store's), the file is set to `epoch` even when it holds a higher one
        (left by a pool whose store was made afresh); without, it only ever grows. Returns the epoch
        the file holds afterwards."""
        with self._locked(fcntl.LOCK_EX):
            current = self.newest()
            if confirm is not None:
                confirm()
            elif current >= epoch:
                return current
            if current != epoch:
                write_atomic(self._path, f"{epoch}\n")
            return epoch

    def reset(self, epoch: int, expected: int) -> int:
        """`advance` with a confirmation made by the caller beforehand (a node reached through a
        remote call, which cannot call back into the store under its lock): set the file to `epoch`,
        even lower, only if it still holds `expected`, the epoch the caller read there before it
        confirmed `epoch` as the store's. Returns the epoch the file holds afterwards."""
        with self._locked(fcntl.LOCK_EX):
            current = self.newest()
            if current != expected:
                return current
            if current != epoch:
                write_atomic(self._path, f"{epoch}\n")
            return epoch
