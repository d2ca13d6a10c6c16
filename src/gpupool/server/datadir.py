"""Keep the server's data directory its own, and say at start-up whose accounts pods run as.

The data directory holds the store, the admin token and the agents' state (pods' logs, exit files,
state records): 0700 directories and 0600 files owned by the server's user, so no pod, running as
another account, can read them. The server runs with umask 077, so every file it or its agents
create later is private too.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from gpupool.agent.identity import POD_GROUP, POOL_ID, account_name, can_switch_users, ensure_account

PRIVATE_UMASK = 0o077
POOL_ID_FILE = "pool-id"


def pool_id(data_dir: Path) -> str:
    """The pool's short stable id, kept in DATA_DIR/pool-id: made (6 random hex digits) on the first
    start, read on every later one. It names the pool's pod accounts (`gpupool-<id>-<tenant>`), so two
    pools on one machine never share an account. Refuses a file that does not hold an id."""
    from gpupool.errors import InvalidInput

    path = data_dir / POOL_ID_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        text = path.read_text(errors="replace").strip()
        if not POOL_ID.match(text):
            raise InvalidInput(f"{str(path)!r} holds {text[:40]!r}, not a pool id (4 to 8 lowercase letters "
                               "and digits); restore it, or remove it to give this pool a new id (its pods "
                               "then run as new accounts).") from None
        return text
    made = secrets.token_hex(3)
    with os.fdopen(fd, "w") as handle:
        handle.write(made + "\n")
    return made


def secure_data_dir(path: Path, flag: str = "--data-dir") -> None:
    """Create `path` 0700 (or close an existing one), close its direct entries (the store, the admin
    token, the agents' directory: 0600 files, 0700 directories), and set umask 077. What lies deeper
    is behind those, so it is not walked: a start-up stays as fast with a long history of pods.
    Refuses a directory another user owns."""
    from gpupool.errors import InvalidInput

    os.umask(PRIVATE_UMASK)
    what = "data" if flag == "--data-dir" else "agent"
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:  # a file there (or on the way), no permission, a read-only file system
        why = {FileExistsError: "it is a file", NotADirectoryError: "a file is in its way"}.get(
            type(exc), exc.strerror)
        raise InvalidInput(f"Cannot create the {what} directory {str(path)!r} ({why}); choose another with "
                           f"{flag}.") from None
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise InvalidInput(f"The {what} directory {str(path)!r} is not a directory owned by this user; "
                           f"choose another with {flag}.")
    os.chmod(path, 0o700)
    with os.scandir(path) as entries:
        for entry in entries:
            _close(Path(entry.path), 0o700 if entry.is_dir(follow_symlinks=False) else 0o600)


def _close(path: Path, mode: int) -> None:
    try:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid():
            return
        if info.st_mode & 0o077:
            os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o077 | (mode & 0o700))
    except OSError:
        pass


def pod_accounts_notice(runs_processes: bool, pool: str = "") -> str:
    """One line on whose accounts pods run as; where the agent is root, the default tenant's
    account (and the pods' group) is created or reused now, so a bad set-up shows at start-up."""
    if not runs_processes:
        return ""
    if not can_switch_users():
        return ("Pods run as this server's own user (it is not root, so it cannot start them as other "
                "accounts): the pool is for that one user; run `gpupool up` as root for tenants.")
    ensure_account(account_name("default", pool), "gpupool pods of tenant default"
                   + (f" of pool {pool}" if pool else ""))
    pattern = f"gpupool-{pool}-<tenant>" if pool else "gpupool-<tenant>"
    return (f"Pods run as unprivileged accounts: {pattern} (group {POD_GROUP}, created on first "
            "use), or the account mapped with `gpupool tenant set NAME --unix-user USER`.")
