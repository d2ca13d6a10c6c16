"""Start pods as other Unix accounts from a small helper process, so the server never forks its heap.

To start a process as another user, CPython's subprocess must fork() (vfork cannot change
credentials safely), and a fork copies the page tables of the whole server: 12 ms a pod with a
300 MB heap, against 0.6 ms for the vfork it uses otherwise. So the runner hands launches that
change users to one helper, started once per runner: a stdlib-only Python process a few MB in size
(`python -I -S`), which forks cheaply, drops privileges in the child (supplementary groups, gid,
uid; PR_SET_NO_NEW_PRIVS is set on the helper itself and inherited), execs the shim, and answers
with the pid. It waits for its children and reports each one's exit status, which the runner uses
when a pod left no exit file. The pod's environment goes straight to the child after the drop: no
program ever runs as root with a user's variables.

Protocol (one SOCK_SEQPACKET socket pair): a request is JSON with the file descriptors for stdin,
stdout, stderr and the exit file as ancillary data; an `argv` item equal to EXIT_FD_PLACEHOLDER is
replaced by the exit file's descriptor number in the helper. Answers: {"id", "pid", "start_ticks"}
or {"id", "error"}; exit reports: {"exited": pid, "returncode": n} (negative: killed by signal -n).
The helper ends when the socket closes (the server stopped); pods it started keep running, in
their own sessions, to be re-adopted.
"""

from __future__ import annotations

import array
import contextlib
import json
import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future

from gpupool.agent.identity import PodIdentity
from gpupool.errors import ProviderError

log = logging.getLogger("gpupool.agent")

EXIT_FD_PLACEHOLDER = "\x00exit-fd"
_MAX_MESSAGE = 4 << 20
_MAX_EXITS_KEPT = 100_000
_SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 32, 33  # Linux; root may exceed the system's buffer maximum

HELPER = r'''
import array, ctypes, ctypes.util, json, os, select, signal, socket, subprocess, sys
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS, inherited by every pod
sock = socket.socket(fileno=int(sys.argv[1]))
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)
PLACEHOLDER = "\x00exit-fd"

def send(obj):
    sock.send(json.dumps(obj).encode())

def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send({"exited": pid, "returncode": -os.WTERMSIG(status) if os.WIFSIGNALED(status)
              else os.waitstatus_to_exitcode(status)})

def ticks(pid):
    try:
        raw = open(f"/proc/{pid}/stat").read()
        return int(raw[raw.rfind(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None

def launch(request, fds):
    stdin, stdout, stderr, exit_fd = fds
    argv = [str(exit_fd) if a == PLACEHOLDER else a for a in request["argv"]]
    try:
        child = subprocess.Popen(argv, cwd="/", env=request["env"], stdin=stdin, stdout=stdout,
                                 stderr=stderr, start_new_session=True, close_fds=True,
                                 pass_fds=(exit_fd,), user=request["uid"], group=request["gid"],
                                 extra_groups=[])
    except OSError as exc:
        return {"id": request["id"], "error": exc.strerror or str(exc)}
    child.returncode = 0  # reaped by reap(), not by Popen
    return {"id": request["id"], "pid": child.pid, "start_ticks": ticks(child.pid)}

while True:
    ready, _, _ = select.select([sock, wake_r], [], [])
    if wake_r in ready:
        os.read(wake_r, 4096)
        reap()
    if sock in ready:
        fds = array.array("i")
        data, ancdata, _, _ = sock.recvmsg(4 << 20, socket.CMSG_SPACE(8 * fds.itemsize))
        if not data:
            sys.exit(0)
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        try:
            send(launch(json.loads(data), list(fds)))
        finally:
            for fd in fds:
                os.close(fd)
        reap()
'''


class Launcher:
    """The runner's side of the helper: launch() is thread-safe and blocks for one round trip."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for end in (ours, theirs):  # one message holds a whole request (a command may be large)
            for option in (_SO_SNDBUFFORCE, _SO_RCVBUFFORCE):
                with contextlib.suppress(OSError):
                    end.setsockopt(socket.SOL_SOCKET, option, _MAX_MESSAGE)
        self._sock = ours
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", HELPER, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"},
                start_new_session=True,
            )
        finally:
            theirs.close()
        self._lock = threading.Lock()
        self._pending: dict[int, Future[dict[str, object]]] = {}
        self._next_id = 0
        self._exits: dict[int, int] = {}
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="gpupool-launcher", daemon=True)
        self._reader.start()

    def launch(self, argv: Sequence[str], env: Mapping[str, str], identity: PodIdentity, *, stdin: int,
               stdout: int, stderr: int, exit_fd: int) -> tuple[int, int | None]:
        """Start `argv` as `identity` (an argv item EXIT_FD_PLACEHOLDER becomes the exit file's
        descriptor); returns (pid, start ticks). Raises OSError when it could not be started and
        ProviderError when the helper is gone."""
        future: Future[dict[str, object]] = Future()
        with self._lock:
            if self._closed:
                raise ProviderError("The pod launcher has stopped; restart the agent.")
            self._next_id += 1
            request_id = self._next_id
            self._pending[request_id] = future
        body = json.dumps({"id": request_id, "argv": list(argv), "env": dict(env), "uid": identity.uid,
                           "gid": identity.gid}).encode()
        fds = array.array("i", [stdin, stdout, stderr, exit_fd])
        try:
            self._sock.sendmsg([body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
        except OSError as exc:
            with self._lock:
                self._pending.pop(request_id, None)
            raise ProviderError(f"The pod launcher did not take the request ({exc.strerror}).") from None
        answer = future.result(timeout=60)
        if "error" in answer:
            raise OSError(str(answer["error"]))
        ticks = answer.get("start_ticks")
        return int(answer["pid"]), None if ticks is None else int(ticks)  # type: ignore[call-overload]

    def returncode(self, pid: int) -> int | None:
        """The exit status the helper reported for `pid` (negative: killed by that signal)."""
        with self._lock:
            return self._exits.get(pid)

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(_MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            with self._lock:
                if "exited" in message:
                    if len(self._exits) >= _MAX_EXITS_KEPT:
                        self._exits.clear()
                    self._exits[int(message["exited"])] = int(message["returncode"])
                    continue
                future = self._pending.pop(int(message["id"]), None)
            if future is not None:
                future.set_result(message)
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_result({"error": "the pod launcher stopped"})

    def close(self) -> None:
        """Stop the helper (pods it started keep running). Idempotent."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)
        self._reader.join(timeout=10)
