"""Mounts and secret uses of a workload (`submit --mount SRC:DST[:ro]`, `--secret NAME[:TARGET]`):
their models, the path rules the API, the configuration and the node share, and the CLI's parsing."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from gpupool.api.common import Name, Strict, refuse_control
from gpupool.errors import InvalidInput

MAX_MOUNTS = 16
MAX_SECRET_USES = 16
SECRETS_DIR = "/run/secrets"
"""Where a pod's secret files appear: a tmpfs of the pod's own mount namespace (never the node's)."""
RESERVED_TARGETS = ("/proc", "/sys", "/dev", SECRETS_DIR)
"""What no mount may cover: the kernel's views, and the directory the pool puts secrets in."""
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FILE_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def clean_path(value: str, what: str) -> str:
    """`value` when it is an absolute path in its one written form (no '.', '..', '//' or trailing
    '/'); ValueError with the sentence otherwise."""
    refuse_control(value, where=f"{what} ")
    if not value.startswith("/"):
        raise ValueError(f"{what} {value!r} must be an absolute path such as /data/team-a")
    parts = value.split("/")[1:]
    if value != "/" and (any(p in ("", ".", "..") for p in parts)):
        raise ValueError(f"{what} {value!r} must be written without '.', '..', '//' or a trailing '/' "
                         "(a mount is resolved by the node, never by walking up)")
    return value


def under(path: str, root: str) -> bool:
    """Whether `path` is `root` or inside it (both clean, absolute)."""
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


class MountSpec(Strict):
    """A directory or file of the node seen by the pod at `target` (its own mount namespace)."""

    source: str = Field(max_length=4096, description="a path on the node, inside one of the tenant's "
                        "allowed roots (tenants.<name>.mounts of the pool's configuration)")
    target: str = Field(max_length=4096, description="where the pod sees it; must exist on the node")
    read_only: bool = False

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return clean_path(value, "the mount's source")

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        clean_path(value, "the mount's target")
        if value == "/" or any(under(value, r) or under(r, value) for r in RESERVED_TARGETS):
            raise ValueError(f"the mount's target {value!r} may not be /, or cover or lie in "
                             f"{', '.join(RESERVED_TARGETS)}; choose another path such as /data")
        return value


class SecretUse(Strict):
    """One of the tenant's secrets given to the pods: each key as its own variable (neither `env` nor
    `path`), its one key as variable `env`, or as files under `path` (one key: the file itself)."""

    name: Name
    env: str = Field("", max_length=256, description="the variable that holds the secret's one key")
    path: str = Field("", max_length=1024, description=f"a path under {SECRETS_DIR}/ (the pod's own tmpfs)")

    @field_validator("env")
    @classmethod
    def _env(cls, value: str) -> str:
        if value and not ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not a variable's name: letters, digits and '_', not starting "
                             "with a digit")
        return value

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value:
            return value
        clean_path(value, "the secret's path")
        parts = value[len(SECRETS_DIR) + 1:].split("/") if under(value, SECRETS_DIR) else []
        if value == SECRETS_DIR or not parts or not all(_FILE_PART.match(p) for p in parts):
            raise ValueError(f"the secret's path {value!r} must lie under {SECRETS_DIR}/ (the pod's own "
                             f"tmpfs), e.g. {SECRETS_DIR}/token, each part letters, digits, '_', '.', '-'")
        return value

    @model_validator(mode="after")
    def _one_target(self) -> SecretUse:
        if self.env and self.path:
            raise ValueError("a secret goes to a variable or to a path, not both")
        return self


SecretKey = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")]
"""A secret's key: a variable's name or a file's name in the pod."""


def parse_mount(text: str) -> MountSpec:
    """`SRC:DST[:ro|:rw]` as given to `submit --mount`; InvalidInput with the sentence otherwise."""
    parts = text.split(":")
    mode: Literal["ro", "rw"] = "rw"
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        mode = parts.pop()  # type: ignore[assignment]
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise InvalidInput(f"--mount {text!r} must be SRC:DST or SRC:DST:ro (paths without ':'), e.g. "
                           "--mount /data/team-a/set:/data:ro.", field="mount")
    try:
        return MountSpec(source=parts[0], target=parts[1], read_only=mode == "ro")
    except ValueError as exc:
        raise InvalidInput(f"--mount {text!r}: {_first_error(exc)}.", field="mount") from None


def parse_secret_use(text: str) -> SecretUse:
    """`NAME`, `NAME:ENV_VAR` or `NAME:/run/secrets/PATH` as given to `submit --secret`."""
    name, _, target = text.partition(":")
    try:
        if target.startswith("/"):
            return SecretUse.model_validate({"name": name, "path": target})
        return SecretUse.model_validate({"name": name, "env": target})
    except ValueError as exc:
        raise InvalidInput(f"--secret {text!r}: {_first_error(exc)}; write NAME, NAME:ENV_VAR or "
                           f"NAME:{SECRETS_DIR}/FILE.", field="secret") from None


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        message = str(first.get("msg", exc)).removeprefix("Value error, ")
        if first.get("type") == "string_pattern_mismatch":
            message = "the name may hold lower-case letters, digits and '-', and starts and ends with a " \
                      "letter or digit"
        return message
    return str(exc)
