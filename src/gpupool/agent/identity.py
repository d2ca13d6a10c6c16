"""Which Unix account a pod runs as, and the private directory it owns.

When the agent runs as root, no pod runs as root or as the server's user: a tenant's pods run as the
account the admin mapped to it (`gpupool tenant create NAME --unix-user USER`), else as an account
of the pool's own, one per tenant of the pool, `gpupool-<pool id>-<tenant>` in the group
`gpupool-pods`, created on first use (a tenant name too long for an account name is shortened and
given a hash suffix). One account per tenant, not one for all: pods of two tenants under one uid
could read each other's files; and one per pool: tenant `a` of two pools on one machine are two
tenants (the pool id is a short random id kept in the pool's data directory, `pool-id`). An agent
given no pool id (one built outside `gpupool up`) names accounts `gpupool-<tenant>`, as pools did
before they had ids.
Work that the admin or a federation hub started for a tenant (`PodLaunch.on_behalf`) runs as a second
account of the tenant's, `<its account>_ob`, made the same way whether the tenant is mapped or not: an
account may read its own processes' environments and files (`/proc/PID/environ`, `/proc/PID/root`),
so code that the tenant did not write must not share the account of pods that hold its secrets.
When the agent is not root it cannot change users, and pods run as its own user (a one-user pool).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import grp
import hashlib
import logging
import os
import pwd
import re
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.errors import InvalidInput, ProviderError

log = logging.getLogger("gpupool.agent")

POD_GROUP = "gpupool-pods"
ACCOUNT_PREFIX = "gpupool-"
POOL_ID = re.compile(r"^[0-9a-z]{4,8}$")
"""What a pool id is (DATA_DIR/pool-id, made by `gpupool up`): 4 to 8 lowercase letters and digits."""
MAX_ACCOUNT_NAME = 32
ON_BEHALF_SUFFIX = "_ob"
"""Ends the account of on-behalf work: tenant names have no underscore, so no tenant's own account does."""
NOLOGIN_SHELLS = ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The pods' PATH unless the operator sets another (GPUPOOL_POD_PATH when the server starts)."""


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """The account a pod runs as."""

    user: str
    uid: int
    gid: int


def can_switch_users() -> bool:
    """Whether this process may start pods as other users (it runs as root)."""
    return os.geteuid() == 0


def account_prefix(pool_id: str = "") -> str:
    """How the pool's own accounts begin: 'gpupool-<pool id>-' ('gpupool-' with no pool id)."""
    return f"{ACCOUNT_PREFIX}{pool_id}-" if pool_id else ACCOUNT_PREFIX


def account_name(tenant: str, pool_id: str = "", *, on_behalf: bool = False) -> str:
    """The pool's own account for `tenant`: 'gpupool-<pool id>-<tenant>' ('gpupool-<tenant>' with no
    pool id), at most 32 characters (a long tenant name is cut and given a hash suffix); with
    `on_behalf`, the account of work others started for the tenant, the same name ending '_ob'."""
    prefix = account_prefix(pool_id)
    suffix = ON_BEHALF_SUFFIX if on_behalf else ""
    name = prefix + tenant + suffix
    if len(name) <= MAX_ACCOUNT_NAME:
        return name
    digest = hashlib.sha256(tenant.encode()).hexdigest()[:8]
    return f"{prefix}{tenant[: MAX_ACCOUNT_NAME - len(prefix) - 9 - len(suffix)]}-{digest}{suffix}"


def is_own_account(entry: pwd.struct_passwd, group: int, pool_id: str = "") -> bool:
    """Whether `entry` is one of the pool's own accounts as ensure_account makes them: named
    gpupool-... (gpupool-<pool id>-... given `pool_id`), primary group `group` (gpupool-pods' gid),
    never root; not an account mapped with --unix-user."""
    prefix = account_prefix(pool_id)
    return entry.pw_name.startswith(prefix) and entry.pw_gid == group and entry.pw_uid != 0


def is_pool_account(identity: PodIdentity) -> bool:
    """Whether the account is one of the pool's own (named gpupool-..., or in the pods' group)."""
    if identity.user.startswith(ACCOUNT_PREFIX):
        return True
    try:
        return identity.gid == grp.getgrnam(POD_GROUP).gr_gid
    except KeyError:
        return False


def mapped_account(user: str) -> PodIdentity:
    """The existing, unprivileged account `user`. Raises InvalidInput when it does not exist or is
    root (uid 0)."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise InvalidInput(
            f"There is no Unix account {user!r} on this machine; create it first (useradd) or map "
            "another one.", unix_user=user,
        ) from None
    if entry.pw_uid == 0:
        raise InvalidInput(f"Unix account {user!r} has uid 0; pods never run as root, map another account.",
                           unix_user=user)
    return PodIdentity(user=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid)


def _nologin_shell() -> str:
    return next((s for s in NOLOGIN_SHELLS if os.path.exists(s)), "/bin/false")


LOCK_WAIT_S = 30.0
"""How long account creation waits for another process (a second pool or agent on this machine,
an administrator's useradd) that holds the account database's lock."""


def _run(argv: list[str]) -> None:
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False,
                                    env={"PATH": BASE_PATH})
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ProviderError(f"Cannot run {argv[0]} to create a pod account: {exc}.") from None
        # useradd and groupadd refuse at once ("cannot lock /etc/passwd; try again later") while
        # another process edits the account files: waiting for it is what the message asks for.
        if result.returncode == 0 or "cannot lock" not in result.stderr or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if result.returncode != 0 and "already exists" not in result.stderr:
        detail = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "no output"
        raise ProviderError(f"{argv[0]} failed (code {result.returncode}): {detail}.")


def ensure_group() -> int:
    """The gid of the pods' group, created (as a system group) when missing."""
    try:
        return grp.getgrnam(POD_GROUP).gr_gid
    except KeyError:
        pass
    if shutil.which("groupadd", path=BASE_PATH) is None:
        raise ProviderError(f"groupadd is not installed, so the group {POD_GROUP!r} cannot be created.")
    _run(["groupadd", "--system", POD_GROUP])
    return grp.getgrnam(POD_GROUP).gr_gid


def ensure_account(name: str, comment: str = "") -> PodIdentity:
    """The pool's account `name` (system account, no login shell, no home), created when missing.
    Refuses an existing account of that name that is not in the pods' group (someone else's)."""
    gid = ensure_group()
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        if shutil.which("useradd", path=BASE_PATH) is None:
            raise ProviderError(f"useradd is not installed, so the pod account {name!r} cannot be created.") \
                from None
        _run(["useradd", "--system", "--gid", str(gid), "--no-create-home", "--home-dir", "/nonexistent",
              "--shell", _nologin_shell(), "--comment", comment or "gpupool pods", name])
        entry = pwd.getpwnam(name)
    if entry.pw_uid == 0 or entry.pw_gid != gid:
        raise ProviderError(
            f"The account {name!r} exists but is not one of the pool's (its group is not {POD_GROUP!r}); "
            "rename it, or map the tenant to an account with `gpupool tenant set --unix-user`."
        )
    return PodIdentity(user=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid)


ROUTER_ACCOUNT = "gpupool_haproxy"
"""The services' router's own account (HAProxy's workers run as it when the pool runs as root): no
tenant's account can have this name (tenant names have no underscore), and it is in no pool group."""


def router_account() -> PodIdentity | None:
    """The router's account where it exists on this machine (the nodes let it reach replicas)."""
    try:
        entry = pwd.getpwnam(ROUTER_ACCOUNT)
    except KeyError:
        return None
    return PodIdentity(user=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid) if entry.pw_uid else None


def ensure_router_account() -> PodIdentity:
    """The router's account (a system account with a group of its own, no login shell, no home),
    created when missing. Raises ProviderError when it cannot be made or is not an unprivileged
    account of its own (uid 0, or in the pods' group)."""
    found = router_account()
    if found is None:
        if shutil.which("useradd", path=BASE_PATH) is None:
            raise ProviderError(f"useradd is not installed, so the router's account {ROUTER_ACCOUNT!r} "
                                "cannot be created.")
        _run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
              "--shell", _nologin_shell(), "--comment", "gpupool services router", ROUTER_ACCOUNT])
        found = router_account()
    pods = _pod_gid()
    if found is None or found.gid == 0 or (pods is not None and found.gid == pods):
        raise ProviderError(f"The account {ROUTER_ACCOUNT!r} exists but is not an unprivileged account of "
                            "its own (uid or group 0, or the pods' group); remove it so the pool can create "
                            "it.")
    return found


def _pod_gid() -> int | None:
    try:
        return grp.getgrnam(POD_GROUP).gr_gid
    except KeyError:
        return None


class Identities:
    """Resolves (and creates) pod accounts; thread-safe, remembers what it resolved."""

    def __init__(self, *, switch_users: bool | None = None, pool_id: str = "") -> None:
        self.switch_users = can_switch_users() if switch_users is None else switch_users
        self.pool_id = pool_id
        """The pool's id (`gpupool-<pool id>-<tenant>` accounts); '' names them `gpupool-<tenant>`."""
        self._lock = threading.Lock()
        self._known: dict[tuple[str, str, bool], PodIdentity] = {}

    def resolve(self, tenant: str, unix_user: str = "", *, on_behalf: bool = False) -> PodIdentity | None:
        """The account for a pod of `tenant` (None: run as this process's own user); with
        `on_behalf`, the tenant's on-behalf account, never the mapped one. Raises InvalidInput for a
        bad mapping and ProviderError when an account cannot be made."""
        if not self.switch_users:
            return None
        tenant = tenant or "default"
        key = (tenant, "" if on_behalf else unix_user, on_behalf)
        with self._lock:
            known = self._known.get(key)
            if known is None:
                pool = f" of pool {self.pool_id}" if self.pool_id else ""
                if on_behalf:
                    known = ensure_account(account_name(tenant, self.pool_id, on_behalf=True),
                                           f"gpupool work for tenant {tenant}{pool} by others")
                elif unix_user:
                    known = mapped_account(unix_user)
                    if is_pool_account(known) and known.user != account_name(tenant, self.pool_id):
                        raise InvalidInput(  # a mapping stored before the server refused it
                            f"Tenant {tenant!r} is mapped to {unix_user!r}, the pool's account of another "
                            "tenant; its pods do not start until `gpupool tenant set --unix-user` maps "
                            "it to an account of its own.", unix_user=unix_user)
                else:
                    known = ensure_account(account_name(tenant, self.pool_id),
                                           f"gpupool pods of tenant {tenant}{pool}")
                self._known[key] = known
            return known

    def remove(self, tenant: str, owned_under: Sequence[Path] = ()) -> list[str]:
        """The tenant was deleted: remove its pool accounts here, its own and its on-behalf one
        (`remove_account`, with what each owns at the top of `owned_under`), and forget what was
        resolved for it. Returns the names of the accounts removed."""
        if not self.switch_users:
            return []
        names = [account_name(tenant, self.pool_id, on_behalf=on_behalf) for on_behalf in (False, True)]
        with self._lock:
            try:
                for name in names:  # both idle before either goes: a uid freed is given to the next account
                    _idle_pool_account(name)
                return [name for name in names if remove_account(name, owned_under)]
            finally:  # whatever went, nothing of it is handed out again from here
                for key in [k for k in self._known if k[0] == tenant]:
                    del self._known[key]


def processes_of(uid: int, proc: Path = Path("/proc")) -> int:
    """How many processes run as `uid` now (by the owner of /proc/PID: the effective uid)."""
    return len(pids_of(uid, proc))


def pids_of(uid: int, proc: Path = Path("/proc")) -> list[int]:
    """The processes running as `uid` now (by the owner of /proc/PID: the effective uid)."""
    found = []
    with os.scandir(proc) as entries:
        for entry in entries:
            if entry.name.isdigit():
                try:
                    if entry.stat(follow_symlinks=False).st_uid == uid:
                        found.append(int(entry.name))
                except OSError:  # ended meanwhile
                    continue
    return found


ENDING_GRACE_S = 2.0
"""How long `remove_account` waits for the account's last processes to end before refusing: a pod
is reported ended once its shim wrote the exit file, and the shim, the account's, exits just after
(on a loaded machine, a deletion right after the last pod's end was refused)."""


def remove_account(name: str, owned_under: Sequence[Path] = (), *, sweep: bool = True) -> bool:
    """Delete the pool's account `name` (userdel) when it exists and is one of the pool's (in the
    pods' group); returns whether one was deleted. What it owns at the top of `owned_under` (its pod
    homes, its checkpoints) and in the host's shared places (`remove_left_behind`) goes first:
    `useradd` gives a freed uid to the next account, which would own them. Raises ProviderError
    while a process still runs as it (a pod's leftovers), saying so: its files would then belong to a
    uid that a later account may be given. `sweep` False: the caller swept the shared places for it
    (`remove_left_behind` of many accounts at once walks them once)."""
    entry = _idle_pool_account(name)
    if entry is None:
        return False
    if shutil.which("userdel", path=BASE_PATH) is None:
        raise ProviderError(f"userdel is not installed, so the pod account {name!r} cannot be removed.")
    remove_owned(owned_under, entry.pw_uid)
    if sweep:
        remove_left_behind({entry.pw_uid})
    _run(["userdel", name])
    return True


def _idle_pool_account(name: str) -> pwd.struct_passwd | None:
    """The pool's account `name` once no process runs as it (None: no such account of the pool's);
    ProviderError, saying so, while one still does after a short grace."""
    try:
        entry = pwd.getpwnam(name)
        gid = grp.getgrnam(POD_GROUP).gr_gid
    except KeyError:
        return None
    if entry.pw_uid == 0 or entry.pw_gid != gid:
        return None  # not one of the pool's: never touched
    running = processes_of(entry.pw_uid)
    deadline = time.monotonic() + ENDING_GRACE_S
    while running and time.monotonic() < deadline:  # a pod's shim still exiting after it wrote the end
        time.sleep(0.02)
        running = processes_of(entry.pw_uid)
    if running:
        raise ProviderError(f"{running} process(es) still run as the account {name!r}; it is removed once "
                            "they have ended (stop them, or wait, and delete the tenant again).")
    return entry


SHARED_WRITABLE = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path("/dev/mqueue"), Path("/run/lock"))
"""The host's places every account may write (pods share them): what a deleted account left there
would belong to the next account given its uid, another tenant's."""
SYSV_IPC = (("shm", "-m"), ("sem", "-s"), ("msg", "-q"))
"""/proc/sysvipc's tables and ipcrm's flag for each: shared memory, semaphores and message queues."""


def remove_left_behind(uids: Collection[int], roots: Sequence[Path] = SHARED_WRITABLE,
                       sysvipc: Path | None = Path("/proc/sysvipc")) -> int:
    """Delete what the `uids` own in the host's shared writable places (at any depth: the topmost entry
    one owns, with what is below it) and their System V IPC objects, before their accounts go:
    `useradd` gives a freed uid to the next account, a later tenant's, which would own them (a file in
    /tmp, a segment in /dev/shm). Nothing runs as them any more (`remove_account` checks first), so
    nothing new appears meanwhile. Returns how many were deleted."""
    if not uids:
        return 0
    removed = 0
    owned_by = [arg for uid in sorted(uids) for arg in ("-o", "-uid", str(uid))][1:]
    for root in roots:
        if not root.is_dir():
            continue
        try:
            found = subprocess.run(["find", str(root), "-xdev", "-mindepth", "1", "(", *owned_by, ")",
                                    "-prune", "-print0"], capture_output=True, check=False,
                                   env={"PATH": BASE_PATH})
        except OSError as exc:
            log.warning("could not search %s for deleted accounts' files: %s", root, exc)
            continue
        for path in filter(None, found.stdout.split(b"\0")):
            removed += remove_tree(Path(os.fsdecode(path)))
    for table, flag in SYSV_IPC:
        for ipc_id in _ipc_owned(sysvipc / table, uids) if sysvipc is not None else ():
            done = subprocess.run(["ipcrm", flag, ipc_id], capture_output=True, check=False,
                                  env={"PATH": BASE_PATH})
            removed += done.returncode == 0
    return removed


def _ipc_owned(table: Path, uids: Collection[int]) -> list[str]:
    """The ids of the objects of a /proc/sysvipc table whose owner (`uid` column) is one of `uids`."""
    try:
        header, *rows = table.read_text().splitlines()
    except (OSError, ValueError):
        return []
    columns = header.split()
    if "uid" not in columns:
        return []
    at_id = columns.index("shmid" if "shmid" in columns else "semid" if "semid" in columns else "msqid")
    at_uid = columns.index("uid")
    owners = {str(uid) for uid in uids}
    return [cells[at_id] for cells in map(str.split, rows)
            if len(cells) > max(at_id, at_uid) and cells[at_uid] in owners]


def remove_tree(path: Path) -> bool:
    """Delete a tree a pod's account controls, as root: `rm -rf --one-file-system`, which walks a
    tree of any depth without recursion (Python's rmtree recurses once per level and fails past
    about a thousand) and follows no link the account made. True when nothing is left."""
    try:
        result = subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True,
                                text=True, check=False, env={"PATH": BASE_PATH})
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)
        return False
    if result.returncode != 0:
        log.warning("could not remove all of %s: %s", path, result.stderr.strip()[:500])
    return not os.path.lexists(path)


def remove_owned(roots: Sequence[Path], uid: int) -> int:
    """Delete every entry of `roots` (not below) that `uid` owns: a deleted account's pod homes and
    checkpoints, which a later account given the same uid would otherwise own. Returns how many."""
    removed = 0
    for root in roots:
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
            except OSError:
                continue
            removed += remove_tree(Path(entry.path))
    return removed


def prepare_scratch_root(path: Path) -> Path:
    """The directory that holds the pods' private directories: created 0711 (others may enter
    their own subdirectory but not list it). Refuses one that another user owns or could write."""
    path.mkdir(parents=True, exist_ok=True, mode=0o711)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise InvalidInput(
            f"The pods' scratch directory {str(path)!r} is not a directory owned by this user; "
            "remove it or choose another with GPUPOOL_SCRATCH_DIR."
        )
    if info.st_mode & 0o777 != 0o711:
        os.chmod(path, 0o711)
    return path


def make_private_dir(root: Path, name: str, identity: PodIdentity | None) -> Path:
    """root/name, created (or reused), mode 0700, owned by the pod's account."""
    directory = os.path.join(root, name)
    try:
        os.mkdir(directory, 0o700)  # umask 077 leaves 0700; a fresh directory needs no checks
        if identity is not None:
            os.chown(directory, identity.uid, identity.gid)
        return Path(directory)
    except FileExistsError:
        pass
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise ProviderError(f"{directory!r} exists and is not a directory.")
    if identity is not None and (info.st_uid, info.st_gid) != (identity.uid, identity.gid):
        os.chown(directory, identity.uid, identity.gid, follow_symlinks=False)
    os.chmod(directory, 0o700, follow_symlinks=False)
    return Path(directory)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def open_owned_dir(parent: Path | int, name: str, mode: int, uid: int, gid: int) -> int:
    """The directory `name` in `parent` (a path, or an open directory's descriptor), made if missing,
    opened without following a symlink, and given to uid:gid with `mode`; returns its descriptor (the
    caller closes it). For the agent's files in a pod's private directory: the pod's account may
    write there, and a running pod of the same account may plant a symlink under a name it can
    predict, so root follows no name there (a symlink or file in its place is removed first; one
    swapped in after that refuses the launch)."""
    if isinstance(parent, int):
        top, where = None, parent
    else:
        top = where = os.open(parent, _DIR_FLAGS)
    try:
        fd = _open_made_dir(where, name, mode)
        if fd < 0:  # ELOOP (a symlink) or ENOTDIR (a file) in its place: not a directory of ours
            os.unlink(name, dir_fd=where)
            fd = _open_made_dir(where, name, mode)
        if fd < 0:
            raise ProviderError(f"{name!r} in the pod's private directory was replaced while the pod was "
                                "prepared; launch it again.")
        _own(fd, mode, uid, gid)
        return fd
    finally:
        if top is not None:
            os.close(top)


def _open_made_dir(parent: int, name: str, mode: int) -> int:
    """`name` in `parent` made if missing and opened as a directory without following a symlink;
    -1 where something else holds the name."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, mode, dir_fd=parent)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            return -1
        raise


def write_owned_file(directory: int, name: str, data: bytes, mode: int, uid: int, gid: int) -> None:
    """`data` as a new file `name` in the open `directory`, owned by uid:gid with `mode`: whatever
    was there under that name is removed first, and the file is created exclusively without
    following a symlink, so root writes into no file the pod's account chose."""
    try:
        os.unlink(name, dir_fd=directory)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise ProviderError(f"{name!r} in the pod's private directory is a directory; remove it and "
                            "launch the pod again.") from None
    try:
        fd = os.open(name, _NEW_FILE, 0o600, dir_fd=directory)
    except FileExistsError:
        raise ProviderError(f"{name!r} in the pod's private directory was made again while the pod "
                            "was prepared; launch it again.") from None
    try:
        with os.fdopen(os.dup(fd), "wb") as handle:
            handle.write(data)
        _own(fd, mode, uid, gid)
    finally:
        os.close(fd)


def _own(fd: int, mode: int, uid: int, gid: int) -> None:
    if os.geteuid() == 0:
        os.fchown(fd, uid, gid)
    os.fchmod(fd, mode)


def base_env(identity: PodIdentity | None, home: Path, path: str = BASE_PATH) -> dict[str, str]:
    """The environment every pod starts from (nothing inherited from the server): PATH, HOME, TMPDIR,
    LANG, USER, LOGNAME, SHELL."""
    return {"PATH": path or BASE_PATH, "HOME": str(home), "TMPDIR": str(home), "LANG": "C.UTF-8",
            "USER": _user_name(identity), "LOGNAME": _user_name(identity), "SHELL": "/bin/sh"}


def _user_name(identity: PodIdentity | None) -> str:
    return identity.user if identity is not None else _own_name(os.geteuid())


@functools.cache
def _own_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
