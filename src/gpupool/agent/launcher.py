"""Start pods as other Unix accounts from small helper processes, so the server never forks its heap.

To start a process as another user, CPython's subprocess must fork() (vfork cannot change
credentials safely), and a fork copies the page tables of the whole server: 12 ms a pod with a
300 MB heap. Instead, the runner starts one root helper (a stdlib-only `python -I -S` process, a few
MB) with PR_SET_NO_NEW_PRIVS set, and asks it, once per account, for an account helper: a fork of
the root helper that serves launches for that account alone. The account helper stays root, so no
process of the account can signal it (a stopped helper would stall every launch it serves) or trace
it; it starts each pod's shim with a fork of its own small heap that clears the supplementary
groups, sets gid then uid, and only then execs the shim with the pod's environment (no program
ever runs as root with a user's variables). It answers without waiting for that exec: from its
setuid on the child is the account's, which could stop it there (a pod spinning on kill(-1,
SIGSTOP) caught about one launch in a hundred so when the helper waited, as subprocess does). It
reaps its children and reports each exit status, which the runner uses when a pod left no exit
file; a child whose exec failed exits 127.

Every exchange with a helper has a deadline (`timeout_s`): a helper that does not answer in time
fails that launch alone with ProviderError, and is killed and replaced by a fresh one at the next
launch. The runner lets a shim started through a helper run the command only after the launch's
answer came back (one line on its standard input), so a child that a replaced helper left behind
never runs anything.

Protocol (SOCK_SEQPACKET socket pairs, JSON messages, descriptors as SCM_RIGHTS):
- root helper: {"id", "uid", "gid"} -> {"id", "pid"} with one descriptor, the runner's end of a new
  account helper's socket; or {"id", "error"};
- account helper: {"id", "argv", "env"[, "netns"][, "ns"]} with stdin, stdout, stderr and the exit file's
  descriptors (then one O_PATH descriptor per mount of "ns": {"mounts": [{"target", "ro"}], "files":
  {path under /run/secrets: base64}}, set up in a mount namespace of the pod's own)
  -> {"id", "pid", "start_ticks"} or {"id", "error"}; an argv item equal to EXIT_FD_PLACEHOLDER
  becomes the exit file's descriptor number there; and {"exited": pid, "returncode": n} reports
  (negative: killed by signal -n).
A helper ends when its socket closes (the server stopped); the pods keep running, each in its own
session, to be re-adopted.
"""

from __future__ import annotations

import array
import contextlib
import errno
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpupool.agent.identity import PodIdentity
from gpupool.agent.mounts import PodNamespace
from gpupool.errors import InvalidInput, ProviderError

log = logging.getLogger("gpupool.launcher")
EXIT_FD_PLACEHOLDER = "\x00exit-fd"
DEFAULT_TIMEOUT_S = 10.0
"""How long one exchange with a helper may take; a launch is a fork and an exec, milliseconds."""
TIMEOUT_ENV = "GPUPOOL_LAUNCH_TIMEOUT_S"
_RETURNCODE_WAIT_S = 0.05
_MAX_MESSAGE = 4 << 20
_MAX_EXITS_KEPT = 100_000
_SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 32, 33  # Linux; root may exceed the system's buffer maximum

HELPER = r'''
import array, base64, ctypes, ctypes.util, errno, json, os, re, select, signal, socket, stat, sys
PLACEHOLDER = "\x00exit-fd"
NETNS = re.compile(r"^gpn-[0-9a-f]{5}-[0-9a-f]{8}$")
CLONE_NEWNET = 0x40000000
BUFFER = 4 << 20

def receive(sock):
    fds = array.array("i")
    try:
        data, ancdata, _, _ = sock.recvmsg(BUFFER, socket.CMSG_SPACE(32 * fds.itemsize))
    except OSError:  # ECONNRESET: the runner closed with exit reports unread; as good as EOF
        return b"", []
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
            request = None
            try:
                try:
                    request = json.loads(data)
                    answer, passing = handle(request, fds)
                except Exception as exc:  # a bad request fails alone; the helper keeps serving
                    answer, passing = {"id": request.get("id") if isinstance(request, dict) else None,
                                       "error": f"bad request ({type(exc).__name__})"}, []
                sock.sendmsg([json.dumps(answer).encode()],
                             [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", passing).tobytes())]
                             if passing else [])
            finally:
                for fd in fds:
                    os.close(fd)
            reap()

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_SLAVE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 19)
SECRETS_DIR = "/run/secrets"

def mount(source, target, fstype, flags, data=None):
    if libc.mount(source, target.encode() if isinstance(target, str) else target, fstype, flags, data) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))

def walk(path):
    """An O_PATH descriptor of `path`, opened from / one component at a time without following a
    symlink (OSError ELOOP for one): the node's directories are shared, so a tenant could plant a
    symlink in a target (into /proc, say) for a root mount call to follow."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    for part in [p for p in path.split("/") if p]:
        try:
            inner = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        finally:
            os.close(fd)
        fd = inner
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.ELOOP, "it is or passes through a symbolic link; name the real path")
    return fd

def at(fd):
    return f"/proc/self/fd/{fd}".encode()

def secret_files(files, uid, gid):
    """The secrets as 0400 files of the account on a fresh tmpfs at /run/secrets (made empty on the
    node once, if missing), remounted read-only; every path is opened below the tmpfs's root."""
    run = walk("/run")
    try:
        try:
            os.mkdir("secrets", 0o755, dir_fd=run)  # empty and root's on the node; the tmpfs covers it
        except FileExistsError:
            pass
        point = os.open("secrets", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=run)
    finally:
        os.close(run)
    size = sum(len(v) for v in files.values()) + 4096 * (2 * len(files) + 16)
    try:
        mount(b"tmpfs", at(point), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              f"mode=0500,uid={uid},gid={gid},size={size}".encode())
    finally:
        os.close(point)
    root = walk(SECRETS_DIR)  # the tmpfs now
    try:
        for path, data in sorted(files.items()):
            *dirs, name = path.split("/")
            if any(part in ("", ".", "..") for part in (*dirs, name)):  # the API refuses them too
                raise OSError(errno.EINVAL, f"{path!r} is not a plain path below /run/secrets")
            where = os.dup(root)
            try:
                for part in dirs:
                    try:
                        os.mkdir(part, 0o500, dir_fd=where)
                        os.chown(part, uid, gid, dir_fd=where, follow_symlinks=False)
                    except FileExistsError:
                        pass
                    inner = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                    dir_fd=where)
                    os.close(where)
                    where = inner
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o400, dir_fd=where)
                try:
                    os.write(fd, data)
                    os.fchown(fd, uid, gid)
                finally:
                    os.close(fd)
            finally:
                os.close(where)
        mount(None, at(root), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    finally:
        os.close(root)

def private_mounts(ns, fds, uid, gid):
    """In the (root) child: a mount namespace of the pod's own, no mount of which reaches the node:
    the secrets as 0400 files of the account on a tmpfs at /run/secrets; each source (an O_PATH
    descriptor the agent opened) bound at its target, with the flags of its file system kept (a
    noexec source stays noexec), nosuid and nodev, read-only for :ro. Sources and targets are
    reached through descriptors, never a path a tenant's symlink could redirect. '' or what failed."""
    if libc.unshare(CLONE_NEWNS) != 0:
        return f"cannot make the pod's mount namespace ({os.strerror(ctypes.get_errno())})"
    try:
        mount(None, "/", None, MS_REC | MS_SLAVE)  # nothing mounted below reaches the node
    except OSError as exc:
        return f"cannot make the pod's mounts private ({exc.strerror})"
    files = {path: base64.b64decode(data) for path, data in ns["files"].items()}
    if files:  # first: no bind of the tenant's may lie under /run/secrets (the API refuses one there)
        try:
            secret_files(files, uid, gid)
        except OSError as exc:
            return f"cannot write the pod's secret files ({exc.strerror})"
    for spec, fd in zip(ns["mounts"], fds):
        target = spec["target"]
        try:
            kept = os.fstatvfs(fd).f_flag & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
            # A bind takes its source from this namespace: the path again, and it must be the very
            # file the agent checked (whose descriptor keeps its inode from being reused)
            here = os.open(spec["source"], os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            checked, found = os.fstat(fd), os.fstat(here)
            if (checked.st_dev, checked.st_ino) != (found.st_dev, found.st_ino):
                return f"{spec['source']} changed while it was being mounted; it was not mounted"
        except OSError as exc:
            return f"cannot open {spec['source']} again to mount it ({exc.strerror})"
        try:
            point = walk(target)
            try:
                mount(at(here), at(point), None, MS_BIND)
            finally:
                os.close(point)
            point = walk(target)  # the bind now: remount it, never what it covers
            try:
                if (os.fstat(point).st_dev, os.fstat(point).st_ino) != (found.st_dev, found.st_ino):
                    return f"{target} changed while it was being mounted; it was not mounted"
                mount(None, at(point), None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | kept
                      | (MS_RDONLY if spec["ro"] else 0))
            finally:
                os.close(point)
        except OSError as exc:
            return f"cannot mount on {target} ({exc.strerror}; the target must exist on the node, a " \
                   "directory for a directory, a file for a file)"
        finally:
            os.close(here)
    return ""

def launcher(uid, gid):
    def launch(request, fds):
        """An account helper's request: start the shim as the account. A fork of this small helper
        drops the supplementary groups, gid then uid and execs; the helper does not wait for the
        exec, so a child that the account stops in between (it is the account's from its setuid
        on) holds up nothing but its own pod. This helper stays root."""
        stdin, stdout, stderr, exit_fd = fds[:4]
        ns = request.get("ns")
        if (ns is None and len(fds) != 4) or (ns is not None and len(fds) != 4 + len(ns["mounts"])):
            return {"id": request["id"], "error": "one descriptor per mount"}, []
        try:
            args = [os.fsencode(str(exit_fd) if a == PLACEHOLDER else a) for a in request["argv"]]
            env = {os.fsencode(k): os.fsencode(v) for k, v in request["env"].items()}
            if not args or any(b"\0" in a for a in args) or any(
                    b"\0" in k or b"=" in k or b"\0" in v for k, v in env.items()):
                raise ValueError("a NUL byte, or '=' in a variable's name")
        except (ValueError, TypeError, AttributeError) as exc:
            return {"id": request["id"], "error": f"cannot pass that command or environment ({exc})"}, []
        netns = request.get("netns") or ""
        ns_fd = -1
        if netns:  # the pod's network namespace, joined by the child while it is still root
            if not isinstance(netns, str) or not NETNS.match(netns):
                return {"id": request["id"], "error": "not a pod network namespace name"}, []
            try:
                ns_fd = os.open("/run/netns/" + netns, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                return {"id": request["id"], "error": f"no network namespace {netns} ({exc.strerror})"}, []
        # The answer waits for the child's setsid (it is still root then: the account cannot stop
        # it), so a stop right after the launch finds the pod's process group.
        in_session_r, in_session_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                signal.set_wakeup_fd(-1)
                for number in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD):
                    signal.signal(number, signal.SIG_DFL)
                if ns_fd >= 0 and libc.setns(ns_fd, CLONE_NEWNET) != 0:
                    os._exit(127)  # never run the pod outside its namespace
                if ns is not None:  # its mounts and secret files, before the pod's session exists
                    failed = private_mounts(ns, fds[4:], uid, gid)
                    if failed:
                        os.write(in_session_w, failed.encode()[:4000])
                        os._exit(127)
                os.setsid()
                os.close(in_session_w)
                os.chdir("/")
                for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
                    os.dup2(fd, target)
                os.set_inheritable(exit_fd, True)
                os.closerange(3, exit_fd)  # nothing of this helper (its socket) reaches the pod
                os.closerange(exit_fd + 1, os.sysconf("SC_OPEN_MAX"))
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                os.execve(args[0], args, env)
            finally:
                os._exit(127)
        os.close(in_session_w)
        if ns_fd >= 0:
            os.close(ns_fd)
        failed = os.read(in_session_r, 4096)  # end of file once the child has its own session (or died)
        os.close(in_session_r)
        if failed:  # its mounts could not be made: it exits without having run anything
            return {"id": request["id"], "error": failed.decode(errors="replace")}, []
        return {"id": request["id"], "pid": pid, "start_ticks": ticks(pid)}, []
    return launch

def account_helper(request, fds):
    """The root helper's request: fork a helper that serves the account's launches (and only its)."""
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
            # Nothing of the root helper may stay open in the account's helper (its socket would let
            # a request ask for a helper of any account): only this helper's own socket.
            os.closerange(3, theirs.fileno())
            os.closerange(theirs.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
            serve(theirs, launcher(int(request["uid"]), int(request["gid"])))
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


def launch_timeout_s() -> float:
    """The helpers' deadline: GPUPOOL_LAUNCH_TIMEOUT_S when set, else DEFAULT_TIMEOUT_S."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise InvalidInput(f"{TIMEOUT_ENV} must be a number of seconds above 0 and at most 3600 (got "
                           f"{text[:40]!r}); unset it for the default of {DEFAULT_TIMEOUT_S:g}.")
    return value


def _big_buffers(sock: socket.socket) -> None:
    """One message holds a whole request (a command may be large)."""
    for option in (_SO_SNDBUFFORCE, _SO_RCVBUFFORCE):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, _MAX_MESSAGE)


def _ready(sock: socket.socket, event: int, deadline: float) -> bool:
    """Whether `sock` becomes ready for `event` (or hung up) before `deadline` (poll: no fd limit)."""
    poller = select.poll()
    poller.register(sock, event)
    while True:
        left_ms = max(0, int((deadline - time.monotonic()) * 1000) + 1)
        if poller.poll(left_ms):
            return True
        if time.monotonic() >= deadline:
            return False


class HelperTimeout(ProviderError):
    """A helper did not answer one exchange within its deadline."""


class _Channel:
    """One helper's socket. A request is sent and its answer read by the calling thread itself
    (under the channel's lock), with no reader thread: a hand-off between threads costs a wait for
    the interpreter lock, which a busy control loop holds for milliseconds. Every wait (for the
    lock, for the answer) ends at the request's deadline; after a timeout the channel is closed,
    as its helper is replaced. Exit reports read on the way, or drained when asked for, are kept in
    `exits`."""

    def __init__(self, sock: socket.socket, helper_pid: int | None = None) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._next_id = 0
        self.helper_pid = helper_pid
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

    def ask(self, body: dict[str, Any], fds: Sequence[int] = (), *,
            timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[dict[str, Any], list[int]]:
        """Send a request and return its answer (and the descriptors it carries). Raises
        HelperTimeout when the answer has not come within `timeout_s` (the channel is then closed:
        replace its helper), ProviderError when the helper is gone."""
        deadline = time.monotonic() + timeout_s
        if not self._lock.acquire(timeout=max(0.0, timeout_s)):
            raise HelperTimeout(f"waited {timeout_s:g} s behind another launch")
        try:
            if self.closed:
                raise ProviderError("The pod launcher has stopped; restart the agent.")
            self._next_id += 1
            request_id = self._next_id
            data = json.dumps({**body, "id": request_id}).encode()
            ancillary = ([(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
                         if fds else [])
            while True:
                try:
                    self._sock.sendmsg([data], ancillary, socket.MSG_DONTWAIT)
                    break
                except BlockingIOError:  # its buffer is full: the helper is not reading
                    if not _ready(self._sock, select.POLLOUT, deadline):
                        raise self._timed_out(timeout_s) from None
                except OSError as exc:
                    raise ProviderError(f"The pod launcher did not take the request ({exc.strerror}).") \
                        from None
            while True:
                if not _ready(self._sock, select.POLLIN, deadline):
                    raise self._timed_out(timeout_s)
                received = self._receive(socket.MSG_DONTWAIT)
                if received is not None and received[0].get("id") == request_id:
                    return received
        finally:
            self._lock.release()

    def _timed_out(self, timeout_s: float) -> HelperTimeout:
        self.closed = True  # a late answer must not be taken for a later request's: no more use
        return HelperTimeout(f"no answer within {timeout_s:g} s")

    def drain(self, wait_s: float = 0.0) -> None:
        """Read the exit reports waiting, without blocking on the helper; with no `wait_s`, nothing
        when a launch holds the socket (that launch reads them on its way)."""
        if not (self._lock.acquire(timeout=wait_s) if wait_s > 0 else self._lock.acquire(blocking=False)):
            return
        try:
            while not self.closed:
                try:
                    if self._receive(socket.MSG_DONTWAIT) is None:
                        return
                except ProviderError:
                    return
        finally:
            self._lock.release()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def kill(self) -> None:
        """Close the socket and kill the helper (it may be stopped: a closed socket would not end it).
        Only at a timeout, while the helper is known to exist: its parent reaps it only once it ended,
        so its pid cannot have been reused."""
        self.closed = True
        self.close()
        if self.helper_pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self.helper_pid, signal.SIGKILL)


class Launcher:
    """The runner's side: launch() is thread-safe and blocks for one round trip to the account's
    helper (plus one to the root helper the first time an account is used), never longer than
    `timeout_s` each."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._accounts: dict[tuple[int, int], _Channel] = {}
        self._proc, self._root = self._start_root()

    @staticmethod
    def _start_root() -> tuple[subprocess.Popen[bytes], _Channel]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for end in (ours, theirs):
            _big_buffers(end)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", HELPER, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"},
                start_new_session=True,
            )
        finally:
            theirs.close()
        return proc, _Channel(ours, proc.pid)

    def _account(self, identity: PodIdentity) -> _Channel:
        key = (identity.uid, identity.gid)
        with self._lock:
            channel = self._accounts.get(key)
            if channel is not None and not channel.closed:
                return channel
            if channel is not None:  # its helper ended, or was killed at a timeout
                channel.close()
            try:
                answer, fds = self._root.ask({"uid": identity.uid, "gid": identity.gid},
                                             timeout_s=self.timeout_s)
            except HelperTimeout as exc:  # never seen: the root helper is the server's own
                log.warning("the root launcher helper did not answer (%s); replacing it", exc)
                self._root.kill()
                self._proc.wait()
                self._proc, self._root = self._start_root()
                raise ProviderError(f"The pod launcher did not answer within {self.timeout_s:g} s; it was "
                                    "replaced, and the pod was not started.") from None
            if "error" in answer or len(fds) != 1:
                for fd in fds:
                    socket.socket(fileno=fd).close()
                raise ProviderError(f"Cannot start a launcher for account {identity.user!r}: "
                                    f"{answer.get('error', 'no socket')}.")
            pid = answer.get("pid")
            channel = self._accounts[key] = _Channel(socket.socket(fileno=fds[0]),
                                                     int(pid) if isinstance(pid, int) else None)
            return channel

    def launch(self, argv: Sequence[str], env: Mapping[str, str], identity: PodIdentity, *, stdin: int,
               stdout: int, stderr: int, exit_fd: int, netns: str = "",
               namespace: PodNamespace | None = None) -> tuple[int, int | None]:
        """Start `argv` as `identity` (an argv item EXIT_FD_PLACEHOLDER becomes the exit file's
        descriptor), inside the network namespace /run/netns/`netns` when one is named (joined
        before the uid changes: an unprivileged pod cannot leave it); returns (pid, start ticks).
        Raises OSError when it could not be started and ProviderError when the helper is gone or
        did not answer within `timeout_s` (the helper is then killed, and the account's next
        launch gets a new one). With a `namespace`, the pod gets a mount namespace of its own with
        those mounts and secret files (made before the uid changes)."""
        channel = self._account(identity)
        try:
            body: dict[str, Any] = {"argv": list(argv), "env": dict(env)}
            if netns:
                body["netns"] = netns
            passed = [stdin, stdout, stderr, exit_fd]
            if namespace is not None:  # its own mounts and secret files (agent/mounts.py)
                body["ns"] = namespace.request()
                passed += [fd for fd, _, _ in namespace.mounts]
            answer, _ = channel.ask(body, passed, timeout_s=self.timeout_s)
        except HelperTimeout as exc:
            channel.kill()
            log.warning("the launcher helper of account %s (pid %s) did not answer (%s); killed it, a new "
                        "one starts at the account's next launch", identity.user, channel.helper_pid, exc)
            raise ProviderError(f"The launcher for account {identity.user!r} did not answer within "
                                f"{self.timeout_s:g} s; it was replaced, and the pod was not "
                                "started.") from None
        if "error" in answer:
            raise OSError(errno.EINVAL, str(answer["error"]))  # strerror: what the runner reports
        ticks = answer.get("start_ticks")
        return int(answer["pid"]), None if ticks is None else int(ticks)

    def returncode(self, pid: int) -> int | None:
        """The exit status a helper reported for `pid` (negative: killed by that signal)."""
        with self._lock:
            channels = list(self._accounts.values())
        for channel in channels:
            # Called while the runner holds its lock: wait for a launch in progress on the channel
            # (milliseconds) but never for a helper that hangs (that launch's deadline).
            channel.drain(wait_s=_RETURNCODE_WAIT_S)
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
        for channel in (*channels, self._root):  # a helper that timed out was killed then
            channel.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)
