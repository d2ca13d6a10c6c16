"""Tenants' secrets at rest: AES-256-GCM (the `cryptography` package) under a key kept in
DATA_DIR/secrets.key (32 random bytes, mode 0600, made on first use and never logged).

Each value is sealed with its tenant and name as associated data, so a ciphertext copied into
another tenant's row (by anyone who can write the store but lacks the key) does not open there.
The store holds only `VERSION || nonce || ciphertext`; whoever has the store and not the key file
reads nothing. Every server process of one pool must share the key file (the data directory).
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import threading
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpupool.errors import GpupoolError, InvalidInput

KEY_FILE = "secrets.key"
_VERSION = b"\x01"
_NONCE_BYTES = 12


class SecretBox:
    """Seal and open the secrets of one pool (thread-safe; the key is read once)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / KEY_FILE
        self._aead: AESGCM | None = None
        self._lock = threading.Lock()

    def _key(self) -> AESGCM:
        with self._lock:
            if self._aead is None:
                self._aead = AESGCM(_load_or_make(self.path))
            return self._aead

    def seal(self, tenant: str, name: str, data: Mapping[str, bytes]) -> bytes:
        plain = json.dumps({k: v.hex() for k, v in sorted(data.items())}).encode()
        nonce = secrets.token_bytes(_NONCE_BYTES)
        return _VERSION + nonce + self._key().encrypt(nonce, plain, _context(tenant, name))

    def open(self, tenant: str, name: str, sealed: bytes) -> dict[str, bytes]:
        if sealed[:1] != _VERSION or len(sealed) < 1 + _NONCE_BYTES + 16:
            raise GpupoolError(f"Secret {tenant}/{name} is not sealed by this pool; create it again.")
        nonce, body = sealed[1:1 + _NONCE_BYTES], sealed[1 + _NONCE_BYTES:]
        try:
            plain = self._key().decrypt(nonce, body, _context(tenant, name))
        except InvalidTag:
            raise GpupoolError(f"Secret {tenant}/{name} does not open with this pool's key "
                               f"({self.path.name} was replaced, or the row was altered); create it "
                               "again.") from None
        return {k: bytes.fromhex(v) for k, v in json.loads(plain).items()}


def _context(tenant: str, name: str) -> bytes:
    return f"gpupool-secret\x00{tenant}\x00{name}".encode()


def _load_or_make(path: Path) -> bytes:
    """The key in `path`, made (0600, whole: written aside, then linked in place) when absent; refuses
    one readable by others. Two processes making it at once agree on the one linked first."""
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, AESGCM.generate_key(bit_length=256))
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077 or info.st_uid != os.geteuid():
            raise InvalidInput(f"The data directory's {KEY_FILE} must be a file of this user with mode "
                               "0600 (it opens every tenant's secrets); chmod 600 it.")
        key = os.read(fd, 64)
    finally:
        os.close(fd)
    if len(key) != 32:
        raise InvalidInput(f"The data directory's {KEY_FILE} does not hold a 32-byte key; restore it from "
                           "a backup (the secrets stored cannot be read without it).")
    return key
