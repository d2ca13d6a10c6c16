"""Per-pod state records the runner persists (atomically, as JSON) and the /proc facts it checks."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from gpupool.pods import PodPhase

FINAL_PHASES = frozenset({PodPhase.SUCCEEDED, PodPhase.FAILED, PodPhase.STOPPED, PodPhase.LOST})


class PodRecord(BaseModel):
    """What the runner knows about one pod; enough to re-adopt it after an agent restart."""

    model_config = ConfigDict(extra="forbid")

    pod_id: str
    command: list[str]
    workdir: str
    phase: PodPhase = PodPhase.STARTING
    pid: int | None = None
    start_ticks: int | None = None
    started_at_s: float = 0.0
    finished_at_s: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    message: str = ""
    stop_requested_at_s: float | None = None
    kill_deadline_s: float | None = None
    cgroup: str | None = None
    uid: int | None = None
    """The account the pod runs as (None: the agent's own)."""
    combined_output: bool = False
    """stdout.log holds stderr too, in the order written (no stderr.log)."""
    adopted: bool = False
    epoch: int | None = None
    """The leader epoch the launch was decided under (`gpupool up --ha`; None: a single server)."""
    never_started: bool = False
    """Ended before its command ran: the agent's process died between saving the pod's process id
    and letting its shim go (shim.NEVER_STARTED), so the scheduler may place it again."""
    net: str = ""
    """The pod's network attachment (netns.PodNet, as JSON; '' when it shares the node's network),
    for its teardown after a restart: kept here rather than in a file of its own, whose creation and
    removal cost the agent about as much CPU as the rest of the namespace's work for a short pod."""

    @property
    def finished(self) -> bool:
        return self.phase in FINAL_PHASES


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` so a reader sees the old or the new content, never a torn file.

    Atomic (write a temporary file, then rename over) but not fsynced: a killed agent or server
    (kill -9) loses nothing, because the page cache outlives the process. Only a power loss can
    lose the latest write, and that is safe: the server's store is the source of truth (a pod is
    recorded `launching` there before it is launched), so a pod whose state file is missing or
    stale after a power loss is reported lost, never started twice. An fsync per write cost about
    30 ms per launch and bounded a node to a few dozen short pods per second (docs/isolation.md).
    """
    # A temporary name of this writer's own. One runner's writes to a path are serialised by its
    # lock, but two runners may share a node's directory (a deposed leader's agent and the new
    # one's, each reaping the same adopted pod): with one fixed name, one writer's rename took the
    # other's file away (ENOENT), or published a file the other had just truncated.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_native_id()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, text.encode("utf-8"))
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_record(path: Path, record: PodRecord) -> None:
    write_atomic(path, record.model_dump_json())


def load_record(path: Path) -> PodRecord | str:
    """The record in `path`, or a one-line reason why it cannot be read."""
    try:
        return PodRecord.model_validate_json(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return f"state file {path} cannot be read ({exc.strerror})"
    except ValidationError:
        return f"state file {path} is corrupt"


MAX_EXIT_FILE_BYTES = 4096


def read_exit_file(path: Path) -> tuple[int, int | None, str] | None:
    """(exit_code, signal, message) written by the shim, or None when absent, empty or unreadable.
    Read as untrusted (the shim runs as the pod's account): bounded, and every field checked."""
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read(MAX_EXIT_FILE_BYTES).decode("utf-8"))
        signum = data.get("signal")
        return (int(data["exit_code"]), None if signum is None else int(signum),
                str(data.get("message", ""))[:512])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def process_alive(pid: int, start_ticks: int | None) -> bool:
    """True when `pid` runs (not a zombie) and, if given, started at `start_ticks` (no pid reuse)."""
    fields = _stat_fields(pid)
    if not fields or fields[0] in ("Z", "X", "x"):
        return False
    return start_ticks is None or int(fields[19]) == start_ticks
