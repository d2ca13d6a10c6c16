"""Per-workload checkpoint directories on this node, and the progress mark a pod touches in one.

SCRATCH/.checkpoints (0711, the agent's) holds one directory per workload, named by its id, mode
0700 and owned by the pod's account: the same directory for every attempt of the workload on this
node (preemption, eviction, retry), so a requeued pod finds what the previous attempt saved. It goes
when the workload ends for good (forget). Workload ids are not secret: what keeps another tenant out
is the mode (0700, one account per tenant), and that no pod may write in the 0711 parent, so none can
rename, replace or pre-create a workload's directory. The parent's name starts with a dot, which no
pod id does, so no pod's private directory (SCRATCH/<pod id>) can ever be it.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import stat
import threading
from pathlib import Path

from gpupool.agent.identity import PodIdentity, make_private_dir, prepare_scratch_root
from gpupool.errors import InvalidInput

CHECKPOINT_DIR_ENV = "GPUPOOL_CHECKPOINT_DIR"
MARK = ".checkpoint"
"""A pod touches $GPUPOOL_CHECKPOINT_DIR/.checkpoint after saving: its mtime is the progress mark."""
ROOT_NAME = ".checkpoints"
_GONE = ".gone-"
_WORKLOAD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

log = logging.getLogger("gpupool.agent")


class CheckpointDirs:
    """The checkpoint directories under one scratch root. Thread-safe; every method returns promptly
    (a directory's files are deleted by a background thread)."""

    def __init__(self, scratch_root: Path) -> None:
        self.root = prepare_scratch_root(Path(scratch_root) / ROOT_NAME)
        self._lock = threading.Lock()
        self._doomed: list[Path] = []
        self._remover: threading.Thread | None = None
        for entry in sorted(self.root.glob(_GONE + "*")):  # left by a removal cut short
            self._remove_soon(entry)

    def path(self, workload_id: str) -> Path:
        """Where the workload's directory is (whether or not it exists). InvalidInput for an id that
        cannot name a directory."""
        if not _WORKLOAD_ID.match(workload_id):
            raise InvalidInput(f"Workload id {workload_id!r} must be 1-128 letters, digits, '.', '_' or "
                               "'-', starting with a letter or digit.")
        return self.root / workload_id

    def prepare(self, workload_id: str, identity: PodIdentity | None) -> Path:
        """The workload's directory, created or reused, 0700 and owned by `identity` (None: this
        process's user)."""
        self.path(workload_id)
        return make_private_dir(self.root, workload_id, identity)

    def mark_s(self, workload_id: str) -> float | None:
        """The mtime (epoch seconds) of the workload's .checkpoint, or None when there is none. The
        tenant controls the directory: the mark is read without following a link, and anything but a
        regular file is refused (None). Never raises."""
        if not _WORKLOAD_ID.match(workload_id):
            return None
        try:
            info = os.lstat(self.root / workload_id / MARK)
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode):
            log.warning("ignoring the checkpoint mark of workload %s: it is not a regular file", workload_id)
            return None
        return info.st_mtime

    def forget(self, workload_id: str) -> None:
        """The workload ended for good: its directory disappears now (renamed aside, so the id is free
        at once) and its files are deleted in the background. Idempotent."""
        if not _WORKLOAD_ID.match(workload_id):
            return
        try:
            os.rmdir(self.root / workload_id)  # the usual case: it never checkpointed (one call)
            return
        except FileNotFoundError:
            return
        except OSError:  # it holds files: renamed aside, deleted in the background
            pass
        aside = self.root / f"{_GONE}{workload_id}-{secrets.token_hex(4)}"
        try:
            os.rename(self.root / workload_id, aside)
        except FileNotFoundError:
            return
        self._remove_soon(aside)

    def _remove_soon(self, path: Path) -> None:
        with self._lock:
            self._doomed.append(path)
            if self._remover is None:
                self._remover = threading.Thread(target=self._remove_all, name="gpupool-checkpoints",
                                                 daemon=True)
                self._remover.start()

    def _remove_all(self) -> None:
        while True:
            with self._lock:
                if not self._doomed:
                    self._remover = None
                    return
                path = self._doomed.pop()
            # rmtree works through directory descriptors and never follows a link the tenant made;
            # what a pod still writes meanwhile is left for the next agent start.
            shutil.rmtree(path, ignore_errors=True)
