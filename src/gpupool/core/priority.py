"""Named priority classes (critical, high, normal, best-effort) and the rank they give a workload."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.core.model import Workload
from gpupool.errors import InvalidInput, UnknownName, did_you_mean


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A named priority: a higher `value` goes first; `preemptible=False` is never a victim."""

    name: str
    value: int
    preemptible: bool = True


DEFAULT_PRIORITY_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("critical", 1000, preemptible=False),
    PriorityClass("high", 100),
    PriorityClass("normal", 0),
    PriorityClass("best-effort", -100),
)

Rank = tuple[int, int]
"""(priority class value, the workload's own priority within its class): compared as a tuple."""


@dataclass(frozen=True, slots=True)
class PriorityClasses:
    """The operator's priority classes; a workload's rank is (class value, its own priority)."""

    classes: tuple[PriorityClass, ...] = DEFAULT_PRIORITY_CLASSES

    def __post_init__(self) -> None:
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise InvalidInput(f"Priority class names must be unique, got {names}.")

    def get(self, name: str) -> PriorityClass | None:
        for cls in self.classes:
            if cls.name == name:
                return cls
        return None

    def require(self, name: str) -> PriorityClass:
        found = self.get(name)
        if found is None:
            names = [c.name for c in self.classes]
            raise UnknownName(
                f"Unknown priority class {name!r}; choose one of {', '.join(names)}."
                + did_you_mean(name, names)
            )
        return found

    def rank(self, workload: Workload) -> Rank:
        """Higher ranks go first and may preempt lower ones; an unknown class ranks as value 0."""
        found = self.get(workload.priority_class)
        return (found.value if found else 0, workload.priority)

    def preemptible(self, workload: Workload) -> bool:
        found = self.get(workload.priority_class)
        return found.preemptible if found else True
