"""Epoch fencing at the node agent: the one component every leader's launches go through.

With several servers (`gpupool up --ha`) each launch carries the leader lease's epoch it was decided
under (`PodLaunch.epoch`). The agent keeps the newest epoch a leader announced at its takeover in
its directory (`epoch`), and a launch is let go (the shim told to run the command) only while its
epoch is not older than that one:

- `advance()`, a new leader's first act at takeover, takes the file's lock exclusively and writes
  its epoch;
- a launch takes the same lock shared from its check until its process id is saved and the shim is
  told to go (or, refused, to run nothing).

So either a deposed leader's launch was let go before the takeover's `advance()` (then its record,
process id included, is on disk when the new leader re-reads the agent's records, and the pod is
adopted, its store row being the `launching` one committed before the hand-over), or it is refused:
its shim reads end-of-file and never runs the command. No launch of an old epoch starts after the
new leader's view of the agent was taken.
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
        """Held by a launch from its check of the epoch until its shim was told to go or not: yields
        the newest epoch; no takeover's `advance()` runs meanwhile."""
        with self._locked(fcntl.LOCK_SH):
            yield self.newest()

    def advance(self, epoch: int, confirm: Callable[[], None] | None = None) -> int:
        """A new leader's takeover: from now on launches of an older epoch are refused. Waits for
        the launches being let go right now. With `confirm` (called under the lock; it raises when
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
