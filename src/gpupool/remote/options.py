"""Where and how long a function runs: its slice, queue, priority and limits, as the API takes them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool.remote.payload import PYTHON, parse_duration_s

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True)
class Options:
    """What each session of a function asks for (see Pool.function for the meaning of each)."""

    gpus: float = 0
    gpu_memory: str | int | None = None
    cpu: str | float = 0
    memory: str | int = 0
    models: tuple[str, ...] = ()
    timeout_s: float | None = None
    idle_timeout_s: float | None = None
    queue: str = "default"
    priority: int = 0
    priority_class: str | None = None
    tenant: str | None = None
    name: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    image: str | None = None
    """An image of the pool's store to run the worker in (it must hold the pool's Python)."""

    @classmethod
    def make(cls, *, gpus: float = 0, gpu_memory: str | int | None = None, cpu: str | float = 0,
             memory: str | int = 0, models: Sequence[str] = (), timeout: str | float | None = None,
             idle_timeout: str | float | None = None, queue: str = "default", priority: int = 0,
             priority_class: str | None = None, tenant: str | None = None, name: str = "",
             env: Mapping[str, str] | None = None, image: str | None = None) -> Options:
        return cls(gpus=gpus, gpu_memory=gpu_memory, cpu=cpu, memory=memory, models=tuple(models),
                   timeout_s=parse_duration_s(timeout, "timeout"),
                   idle_timeout_s=parse_duration_s(idle_timeout, "idle_timeout"), queue=queue,
                   priority=priority, priority_class=priority_class, tenant=tenant, name=name,
                   env=dict(env or {}), image=image)

    def named(self, name: str) -> Options:
        """These options with a workload name made from `name` when none was given."""
        if self.name:
            return self
        clean = "".join(c if c in _NAME_CHARS else "-" for c in name)[:60].strip("-.") or "function"
        return dataclasses.replace(self, name=f"fn-{clean}"[:63])

    def session_body(self, *, one_shot: bool, payload: str | None = None) -> dict[str, Any]:
        """The POST /calls/sessions body."""
        resources: dict[str, Any] = {"gpus": self.gpus, "cpu": self.cpu, "memory": self.memory,
                                     "models": list(self.models)}
        if self.gpu_memory is not None:
            resources["gpu_memory"] = self.gpu_memory
        body: dict[str, Any] = {"python": PYTHON, "resources": resources, "queue": self.queue,
                                "priority": self.priority, "one_shot": one_shot, "env": dict(self.env),
                                "name": self.name}
        for key, value in (("priority_class", self.priority_class), ("tenant", self.tenant),
                           ("image", self.image),
                           ("time_limit_s", self.timeout_s), ("idle_timeout_s", self.idle_timeout_s)):
            if value is not None:
                body[key] = value
        if payload is not None:
            body["call"] = {"payload": payload}
        return body
