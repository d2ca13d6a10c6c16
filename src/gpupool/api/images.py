"""The HTTP models of the pool's image store: what `gpupool image ls` lists and import answers."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpupool.api.common import PATTERN_RULES, Strict

IMAGE_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
IMAGE_NAME_RULE = PATTERN_RULES[IMAGE_NAME_PATTERN]
ImageName = Annotated[str, Field(min_length=1, max_length=63, pattern=IMAGE_NAME_PATTERN,
                                 description=IMAGE_NAME_RULE)]


class ImageOut(Strict):
    """One image of the pool's store: every tenant's pods may run in it, only an admin imports one."""

    name: ImageName
    digest: str = Field(description="sha256 of the archive it was imported from: 'sha256:<hex>'")
    size_bytes: int = Field(ge=0, description="what its root filesystem holds on the server's disk")
    files: int = Field(ge=0, description="entries of its root filesystem")
    created_s: float = Field(description="when it was imported (Unix time)")
    source: str = Field(description="what the archive was: 'rootfs' (a tar of a root filesystem) or 'oci' "
                        "(an OCI image layout, layers applied in order)")
    skipped: list[str] = Field(default_factory=list, description=(
        "what the import left out or changed, one line each (device nodes, set-uid bits)"))
