"""API models for a tenant's secrets: what is sent to create one, and what is ever answered (names
and times, never a value)."""

from __future__ import annotations

import base64
import binascii

from pydantic import Field, field_validator

from gpupool.api.common import Name, Strict
from gpupool.api.mounts import SecretKey

MAX_SECRET_KEYS = 64
MAX_SECRET_BYTES = 256 * 1024
"""A secret's values together, decoded: credentials and small key files, not data sets."""


class SecretCreate(Strict):
    name: Name
    tenant: Name | None = Field(None, description="admin only: the tenant it belongs to")
    data: dict[SecretKey, str] = Field(min_length=1, max_length=MAX_SECRET_KEYS, description=(
        "key -> value, base64-encoded (a file's bytes, or text)"))
    replace: bool = Field(False, description="replace a secret of that name (else 409 when it exists)")

    @field_validator("data")
    @classmethod
    def _base64(cls, value: dict[str, str]) -> dict[str, str]:
        total = 0
        for key, text in value.items():
            try:
                total += len(base64.b64decode(text, validate=True))
            except (binascii.Error, ValueError):
                raise ValueError(f"the value of key {key!r} is not base64; encode it "
                                 "(gpupool secret create encodes for you)") from None
        if total > MAX_SECRET_BYTES:
            raise ValueError(f"the secret's values hold {total} bytes together, above the limit of "
                             f"{MAX_SECRET_BYTES}; keep large files on a mount instead")
        return value


class SecretOut(Strict):
    """A secret as anyone ever sees it: its name, keys and times; its values never leave the server
    except to its tenant's pods."""

    tenant: str
    name: str
    keys: list[str]
    created_s: float
    updated_s: float


class SecretDeleted(Strict):
    tenant: str
    name: str
