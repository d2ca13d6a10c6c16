"""`submit --mount`: a tenant's pods may mount only from the roots the configuration allows it
(`tenants.<name>.mounts`); checked at submit (by path) and again by the node at the launch (with
symlinks resolved, agent/mounts.py)."""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.api.mounts import MountSpec, under
from gpupool.config import MountRootConfig, PoolConfig
from gpupool.errors import InvalidInput
from gpupool.pods import PodMount


def allowed_root(roots: Sequence[MountRootConfig], mount: MountSpec) -> MountRootConfig | None:
    """The innermost root that holds the mount's source and allows its mode, if any."""
    fitting = [r for r in roots if under(mount.source, r.path) and (mount.read_only or r.mode == "rw")]
    return max(fitting, key=lambda r: len(r.path), default=None)


def check(config: PoolConfig, tenant: str, mounts: Sequence[MountSpec]) -> None:
    """InvalidInput, naming the tenant's allowed roots, for a mount outside them (or writable in a
    read-only one)."""
    if not mounts:
        return
    roots = config.mount_roots(tenant)
    for mount in mounts:
        if allowed_root(roots, mount) is not None:
            continue
        if not roots:
            raise InvalidInput(f"Tenant {tenant!r} may not mount anything: the pool's configuration allows "
                               f"it no roots (ask the admin for tenants.{tenant}.mounts).", field="mounts")
        listed = ", ".join(f"{r.path} ({r.mode})" for r in roots)
        inside = [r for r in roots if under(mount.source, r.path)]
        if inside and not mount.read_only:
            raise InvalidInput(f"{mount.source} lies in a read-only root of tenant {tenant!r}; mount it with "
                               f":ro (allowed roots: {listed}).", field="mounts")
        raise InvalidInput(f"{mount.source} is outside the roots tenant {tenant!r} may mount from: "
                           f"{listed}; mount a path inside one of them.", field="mounts")


def pod_mounts(config: PoolConfig, tenant: str, mounts: Sequence[dict[str, object]]) -> tuple[PodMount, ...]:
    """The stored spec's mounts for a launch, each with the root that allows it now ('' when the
    configuration no longer does: the node refuses the pod with the sentence)."""
    roots = config.mount_roots(tenant)
    out = []
    for raw in mounts:
        mount = MountSpec.model_validate(raw)
        root = allowed_root(roots, mount)
        out.append(PodMount(mount.source, mount.target, mount.read_only, root.path if root else ""))
    return tuple(out)
