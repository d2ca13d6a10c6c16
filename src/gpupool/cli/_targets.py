"""Turn the ids a user typed (whole, or any unique prefix) into workloads, for show, wait and cancel."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpupool.errors import InvalidInput, NotFound

ID_PREFIX = "w-"
SHOWN_CANDIDATES = 5


def resolve(pool: Any, target: str) -> Any:
    """The one workload whose id is `target` or starts with it (`w-` may be left out).
    InvalidInput (exit 2) names the candidates of an ambiguous prefix; NotFound (exit 3) otherwise."""
    if not target or "/" in target:
        raise InvalidInput(f"{target!r} is not a workload id; ids look like w-1a2b3c4d5e6f.")
    prefixes = [target] if target.startswith(ID_PREFIX) else [ID_PREFIX + target, target]
    for prefix in prefixes:
        page = pool.workloads(id_prefix=prefix, limit=SHOWN_CANDIDATES + 1)
        exact = [w for w in page.items if w.id == target]
        if exact:
            return exact[0]
        if page.total == 1:
            return page.items[0]
        if page.total > 1:
            shown = ", ".join(w.id for w in page.items[:SHOWN_CANDIDATES])
            more = f" and {page.total - SHOWN_CANDIDATES} more" if page.total > SHOWN_CANDIDATES else ""
            raise InvalidInput(f"{target!r} matches {page.total} workloads ({shown}{more}); give more of "
                               "the id.")
    raise NotFound(f"No workload {target!r}; list yours with `gpupool ls`.")


def resolve_all(pool: Any, targets: Sequence[str]) -> list[Any]:
    """Each target resolved, in order, duplicates dropped; the first bad one raises."""
    seen: dict[str, Any] = {}
    for target in targets:
        workload = resolve(pool, target)
        seen.setdefault(workload.id, workload)
    return list(seen.values())
