"""Where `gpupool up` takes the store's URL from, and how a URL is shown.

A process's command line is world-readable (`/proc/PID/cmdline`, `ps`) on a machine whose `/proc`
is not mounted with `hidepid=2`, and the local agent's pods run on the server's machine: a password
given as `--database-url` would reach every tenant. So a URL that carries a password is refused on the
command line, and taken instead from a file only the server's user can read
(`--database-url-file`) or from the environment (`GPUPOOL_DATABASE_URL`, which only the process's
own user and root can read, and which `gpupool up` removes from its environment once read, so no
process it starts inherits it). Wherever a URL is printed, its password is masked.
"""

from __future__ import annotations

import os
import stat
from collections.abc import MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING

from gpupool.errors import InvalidInput

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

URL_ENV = "GPUPOOL_DATABASE_URL"
MAX_URL_FILE_BYTES = 64 * 1024
MASK = "***"


def _parse(url: str) -> URL | None:
    """SQLAlchemy's URL of `url`, or None when it is not one."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url)
    except (ArgumentError, ValueError):
        return None


def has_password(url: str) -> bool:
    """Whether `url` carries a password: in its user part, or as a `password=` query parameter
    (psycopg passes query parameters to libpq, which takes a password there too)."""
    parsed = _parse(url)
    if parsed is None:
        return ":" in url.partition("://")[2].partition("@")[0] or "password=" in url.lower()
    return bool(parsed.password) or any(key.lower() == "password" for key in parsed.query)


def mask(url: str) -> str:
    """`url` fit to print: its password (user part or query) replaced by ***."""
    parsed = _parse(url)
    if parsed is None:
        scheme = url.partition("://")[0] if "://" in url else ""
        return f"{scheme}://{MASK}" if scheme and len(scheme) < 40 else "(not a database URL)"
    secret = [key for key in parsed.query if key.lower() == "password"]
    if secret:  # a plain word survives the URL's quoting, then becomes the mask
        parsed = parsed.update_query_dict({key: "GPUPOOLMASKED" for key in secret})
    return str(parsed.render_as_string(hide_password=True)).replace("GPUPOOLMASKED", MASK)


def check(url: str) -> None:
    """InvalidInput, one sentence with the password masked, unless SQLAlchemy can read `url` and has
    its driver (a bad port or an unknown driver would otherwise end in a traceback at start)."""
    from sqlalchemy.exc import NoSuchModuleError

    parsed = _parse(url)
    if parsed is None:
        raise InvalidInput(f"The database URL {mask(url)!r} cannot be read (a port that is not a "
                           "number?); write it as postgresql+psycopg://USER@HOST:PORT/DB or sqlite:///PATH.")
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise InvalidInput(f"The database URL {mask(url)!r} is an in-memory SQLite store, which each "
                           "connection would see empty; give a file, sqlite:///PATH.")
    try:
        parsed.get_dialect()
    except NoSuchModuleError:
        raise InvalidInput(f"The database URL {mask(url)!r} names a driver that is not installed; use "
                           "postgresql+psycopg://... or sqlite:///PATH.") from None


def read_url_file(path: Path) -> str:
    """The URL held in `path`: a regular file owned by this user (or root) that neither its group
    nor others may read, as ssh requires of a private key. Raises InvalidInput with one sentence."""
    flag = "--database-url-file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise InvalidInput(f"Cannot read {flag} {str(path)!r} ({exc.strerror or exc}).") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(f"{flag} {str(path)!r} is not a regular file; give a file holding the URL.")
        if info.st_uid not in (os.geteuid(), 0):
            raise InvalidInput(f"{flag} {str(path)!r} belongs to uid {info.st_uid}, not to this user; "
                               "the file holding the database password must be yours (or root's).")
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise InvalidInput(
                f"{flag} {str(path)!r} is readable or writable by others (mode "
                f"{stat.S_IMODE(info.st_mode):04o}), so the database password in it is not private; "
                f"run chmod 600 {path} and start again.")
        with os.fdopen(fd, "rb", closefd=True) as handle:
            fd = -1
            data = handle.read(MAX_URL_FILE_BYTES + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > MAX_URL_FILE_BYTES:
        raise InvalidInput(f"{flag} {str(path)!r} is larger than {MAX_URL_FILE_BYTES // 1024} KiB; "
                           "it should hold one database URL.")
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InvalidInput(f"{flag} {str(path)!r} is not UTF-8 text; it should hold one database "
                           "URL.") from None
    if not text or "\n" in text:
        raise InvalidInput(f"{flag} {str(path)!r} should hold exactly one database URL on one line.")
    return text


def resolve(flag_url: str, url_file: Path | None, environ: MutableMapping[str, str] | None = None) -> str:
    """The store's URL from --database-url (no password allowed there), --database-url-file or
    GPUPOOL_DATABASE_URL, in that order ('' = the embedded SQLite store). GPUPOOL_DATABASE_URL is
    removed from `environ` (this process's environment by default) whichever wins, so nothing the
    server starts inherits it."""
    env = os.environ if environ is None else environ
    from_env = env.pop(URL_ENV, "").strip()
    if flag_url and url_file is not None:
        raise InvalidInput("Give --database-url or --database-url-file, not both.")
    if flag_url:
        if has_password(flag_url):
            raise InvalidInput(
                f"--database-url {mask(flag_url)} carries a password, and a command line can be read by "
                "every user of this machine (ps, /proc/PID/cmdline), pods included; put the URL in a "
                f"file only you can read and pass --database-url-file FILE, or set {URL_ENV}.")
        return flag_url
    if url_file is not None:
        return read_url_file(url_file)
    return from_env
