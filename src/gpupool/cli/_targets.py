"""Turn the ids a user typed (whole, or any unique prefix) into workloads or arrays, for show, logs,
wait, cancel and ls.

An array's id (`gpupool submit --array` prints it) names all its tasks (`ID_INDEX`); so does any
prefix that only its tasks start with. Verbs that act on one workload (show, logs) refuse an array
with a sentence naming one of its tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.errors import InvalidInput, NotFound

ID_PREFIX = "w-"
SHOWN_CANDIDATES = 5


@dataclass(frozen=True)
class Target:
    """A workload (`workload` set) or an array of `tasks` tasks (`workload` None)."""

    id: str
    workload: Any = None
    tasks: int = 0

    @property
    def is_array(self) -> bool:
        return self.workload is None


def resolve_target(pool: Any, target: str) -> Target:
    """The one workload or array whose id is `target` or starts with it (`w-` may be left out).
    InvalidInput (exit 2) names the candidates of an ambiguous prefix; NotFound (exit 3) otherwise."""
    if not target or "/" in target:
        raise InvalidInput(f"{target!r} is not a workload id; ids look like w-1a2b3c4d5e6f.")
    prefixes = [target] if target.startswith(ID_PREFIX) else [ID_PREFIX + target, target]
    for prefix in prefixes:
        page = pool.workloads(id_prefix=prefix, limit=SHOWN_CANDIDATES + 1)
        exact = [w for w in page.items if w.id == target]
        if exact:
            return Target(exact[0].id, exact[0])
        if page.total == 1 and page.items[0].array_id is None:
            return Target(page.items[0].id, page.items[0])
        if page.total >= 1:
            array = _one_array(pool, prefix, page)
            if array is not None:
                return array
            shown = ", ".join(w.id for w in page.items[:SHOWN_CANDIDATES])
            more = f" and {page.total - SHOWN_CANDIDATES} more" if page.total > SHOWN_CANDIDATES else ""
            raise InvalidInput(f"{target!r} matches {page.total} workloads ({shown}{more}); give more of "
                               "the id.")
    raise NotFound(f"No workload {target!r}; list yours with `gpupool ls`.")


def _one_array(pool: Any, prefix: str, page: Any) -> Target | None:
    """The array whose tasks are exactly the workloads starting with `prefix`, if there is one."""
    array_id = page.items[0].array_id
    if array_id is None or not array_id.startswith(prefix):
        return None
    if any(w.array_id != array_id for w in page.items):
        return None
    tasks = pool.workloads(array_id=array_id, limit=1).total
    return Target(array_id, None, tasks) if tasks == page.total else None


def resolve(pool: Any, target: str) -> Any:
    """The one workload `target` names; an array is InvalidInput naming its first task."""
    found = resolve_target(pool, target)
    if found.is_array:
        first = pool.workloads(array_id=found.id, limit=1).items
        example = first[0].id if first else f"{found.id}_0"
        raise InvalidInput(f"{found.id} is an array of {found.tasks} tasks; name one task (e.g. "
                           f"{example}) or list them with `gpupool ls {found.id}`.")
    return found.workload


def resolve_all(pool: Any, targets: Sequence[str]) -> list[Any]:
    """Each target resolved to one workload, in order, duplicates dropped; the first bad one raises."""
    seen: dict[str, Any] = {}
    for target in targets:
        workload = resolve(pool, target)
        seen.setdefault(workload.id, workload)
    return list(seen.values())


def resolve_targets(pool: Any, targets: Sequence[str]) -> list[Target]:
    """Each target resolved to a workload or an array, in order, duplicates dropped."""
    seen: dict[str, Target] = {}
    for target in targets:
        found = resolve_target(pool, target)
        seen.setdefault(found.id, found)
    return list(seen.values())
