"""Start pods as other Unix accounts from small helper processes, so the server never forks its heap.

To start a process as another user, CPython's subprocess must fork() (vfork cannot change
credentials safely), and a fork copies the page tables of the whole server: 12 ms a pod with a
300 MB heap, against 0.6 ms for the vfork it uses otherwise. Instead, the runner starts one root
helper (a stdlib-only `python -I -S` process, a few MB) with PR_SET_NO_NEW_PRIVS set, and asks it,
once per account, for an account helper: a fork of the root helper that drops its supplementary
groups, gid and uid and then serves launches for that account alone. Already running as the
account, it starts each pod's shim with an ordinary vfork, with the pod's environment (no program
ever runs as root with a user's variables), waits for its children and reports each exit status,
which the runner uses when a pod left no exit file. A pod can only reach its own account's helper
(same uid), which can only start processes as that account.

Protocol (SOCK_SEQPACKET socket pairs, JSON messages, descriptors as SCM_RIGHTS):
- root helper: {"id", "uid", "gid"} -> {"id", "pid"} with one descriptor, the runner's end of a new
  account helper's socket; or {"id", "error"};
- account helper: {"id", "argv", "env"} with stdin, stdout, stderr and the exit file's descriptors
  -> {"id", "pid", "start_ticks"} or {"id", "error"}; an argv item equal to EXIT_FD_PLACEHOLDER
  becomes the exit file's descriptor number there; and {"exited": pid, "returncode": n} reports
  (negative: killed by signal -n).
A helper ends when its socket closes (the server stopped); the pods keep running, each in its own
session, to be re-adopted.
"""

from __future__ import annotations

import array
import contextlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from gpupool.agent.identity import PodIdentity
from gpupool.errors import ProviderError

EXIT_FD_PLACEHOLDER = "\x00exit-fd"
_MAX_MESSAGE = 4 << 20
_MAX_EXITS_KEPT = 100_000
_SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 32, 33  # Linux; root may exceed the system's buffer maximum

HELPER = r'''
import array, ctypes, ctypes.util, json, os, select, signal, socket, subprocess, sys
PLACEHOLDER = "\x00exit-fd"
BUFFER = 4 << 20

def receive(sock):
    fds = array.array("i")
    data, ancdata, _, _ = sock.recvmsg(BUFFER, socket.CMSG_SPACE(8 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)

def ticks(pid):
    try:
        raw = open(f"/proc/{pid}/stat").read()
        return int(raw[raw.rfind(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None

def serve(sock, handle):
    """Answer requests until the socket closes; report exits of children (account helpers)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    def reap():
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.waitstatus_to_exitcode(status)
            try:
                sock.send(json.dumps({"exited": pid, "returncode": code}).encode())
            except OSError:  # the agent is gone (it closed the socket): nobody to report to
                os._exit(0)
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            reap()
        if sock in ready:
            data, fds = receive(sock)
            if not data:
                os._exit(0)
            try:
                answer, passing = handle(json.loads(data), fds)
                sock.sendmsg([json.dumps(answer).encode()],
                             [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", passing).tobytes())]
                             if passing else [])
            finally:
                for fd in fds:
                    os.close(fd)
            reap()

def launch(request, fds):
    """An account helper's request: start the shim (a vfork: no change of credentials here)."""
    stdin, stdout, stderr, exit_fd = fds
    argv = [str(exit_fd) if a == PLACEHOLDER else a for a in request["argv"]]
    try:
        child = subprocess.Popen(argv, cwd="/", env=request["env"], stdin=stdin, stdout=stdout,
                                 stderr=stderr, start_new_session=True, close_fds=True, pass_fds=(exit_fd,))
    except OSError as exc:
        return {"id": request["id"], "error": exc.strerror or str(exc)}, []
    child.returncode = 0  # reaped by serve(), not by Popen
    return {"id": request["id"], "pid": child.pid, "start_ticks": ticks(child.pid)}, []

def account_helper(request, fds):
    """The root helper's request: fork a helper that becomes the account and serves its launches."""
    if not request["uid"] or not request["gid"]:
        return {"id": request["id"], "error": "pods never run as root"}, []
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for end in (ours, theirs):
        for option in (32, 33):  # SO_SNDBUFFORCE, SO_RCVBUFFORCE
            try:
                end.setsockopt(socket.SOL_SOCKET, option, BUFFER)
            except OSError:
                pass
    pid = os.fork()
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)
            ours.close()
            # Nothing of the root helper may stay open in a process of the account (its socket
            # would let a pod ask for a helper of any account): only this helper's own socket.
            os.closerange(3, theirs.fileno())
            os.closerange(theirs.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
            os.setgroups([])
            os.setgid(request["gid"])
            os.setuid(request["uid"])
            serve(theirs, launch)
        finally:
            os._exit(1)
    theirs.close()
    answer = {"id": request["id"], "pid": pid}
    passing = [ours.detach()]
    return answer, passing

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: inherited by every helper and pod
root = socket.socket(fileno=int(sys.argv[1]))
serve(root, account_helper)
'''


def _big_buffers(sock: socket.socket) -> None:
    """One message holds a whole request (a command may be large)."""
    for option in (_SO_SNDBUFFORCE, _SO_RCVBUFFORCE):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, _MAX_MESSAGE)


class _Channel:
    """One helper's socket. A request is sent and its answer read by the calling thread itself
    (under the channel's lock), with no reader thread: a hand-off between threads costs a wait for
    the interpreter lock, which a busy control loop holds for milliseconds. Exit reports read on
    the way, or drained when asked for, are kept in `exits`."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._next_id = 0
        self.exits: dict[int, int] = {}
        self.closed = False

    def _receive(self, flags: int = 0) -> tuple[dict[str, Any], list[int]] | None:
        """One message (None: nothing waiting, with MSG_DONTWAIT); marks the channel closed at EOF."""
        fds = array.array("i")
        try:
            data, ancdata, _, _ = self._sock.recvmsg(_MAX_MESSAGE, socket.CMSG_SPACE(4 * fds.itemsize), flags)
        except BlockingIOError:
            return None
        except OSError:
            data, ancdata = b"", []
        if not data:
            self.closed = True
            raise ProviderError("The pod launcher has stopped; restart the agent.")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        message = json.loads(data)
        if "exited" in message:
            if len(self.exits) >= _MAX_EXITS_KEPT:
                self.exits.clear()
            self.exits[int(message["exited"])] = int(message["returncode"])
        return message, list(fds)

    def ask(self, body: dict[str, Any], fds: Sequence[int] = ()) -> tuple[dict[str, Any], list[int]]:
        """Send a request and return its answer (and the descriptors it carries)."""
        with self._lock:
            if self.closed:
                raise ProviderError("The pod launcher has stopped; restart the agent.")
            self._next_id += 1
            request_id = self._next_id
            data = json.dumps({**body, "id": request_id}).encode()
            ancillary = ([(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
                         if fds else [])
            try:
                self._sock.sendmsg([data], ancillary)
            except OSError as exc:
                raise ProviderError(f"The pod launcher did not take the request ({exc.strerror}).") from None
            while True:
                received = self._receive()
                if received is not None and received[0].get("id") == request_id:
                    return received

    def drain(self) -> None:
        """Read the exit reports waiting, without blocking."""
        with self._lock:
            while not self.closed:
                try:
                    if self._receive(socket.MSG_DONTWAIT) is None:
                        return
                except ProviderError:
                    return

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


class Launcher:
    """The runner's side: launch() is thread-safe and blocks for one round trip to the account's
    helper (plus one to the root helper the first time an account is used)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for end in (ours, theirs):
            _big_buffers(end)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", HELPER, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"},
                start_new_session=True,
            )
        finally:
            theirs.close()
        self._root = _Channel(ours)
        self._lock = threading.Lock()
        self._accounts: dict[tuple[int, int], _Channel] = {}

    def _account(self, identity: PodIdentity) -> _Channel:
        key = (identity.uid, identity.gid)
        with self._lock:
            channel = self._accounts.get(key)
            if channel is not None and not channel.closed:
                return channel
            answer, fds = self._root.ask({"uid": identity.uid, "gid": identity.gid})
            if "error" in answer or len(fds) != 1:
                for fd in fds:
                    socket.socket(fileno=fd).close()
                raise ProviderError(f"Cannot start a launcher for account {identity.user!r}: "
                                    f"{answer.get('error', 'no socket')}.")
            channel = self._accounts[key] = _Channel(socket.socket(fileno=fds[0]))
            return channel

    def launch(self, argv: Sequence[str], env: Mapping[str, str], identity: PodIdentity, *, stdin: int,
               stdout: int, stderr: int, exit_fd: int) -> tuple[int, int | None]:
        """Start `argv` as `identity` (an argv item EXIT_FD_PLACEHOLDER becomes the exit file's
        descriptor); returns (pid, start ticks). Raises OSError when it could not be started and
        ProviderError when the helper is gone."""
        answer, _ = self._account(identity).ask({"argv": list(argv), "env": dict(env)},
                                                [stdin, stdout, stderr, exit_fd])
        if "error" in answer:
            raise OSError(str(answer["error"]))
        ticks = answer.get("start_ticks")
        return int(answer["pid"]), None if ticks is None else int(ticks)

    def returncode(self, pid: int) -> int | None:
        """The exit status a helper reported for `pid` (negative: killed by that signal)."""
        with self._lock:
            channels = list(self._accounts.values())
        for channel in channels:
            channel.drain()
            code = channel.exits.get(pid)
            if code is not None:
                return code
        return None

    def drain(self) -> None:
        """Read the exit reports waiting on every account's socket (so none fills up)."""
        with self._lock:
            channels = list(self._accounts.values())
        for channel in channels:
            channel.drain()

    def close(self) -> None:
        """Stop the helpers (pods they started keep running). Idempotent."""
        with self._lock:
            channels, self._accounts = list(self._accounts.values()), {}
        for channel in (*channels, self._root):
            channel.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)
