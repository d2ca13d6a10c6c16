"""Ride out a server restart: retry calls that found the server unreachable, with backoff, for a budget.

`wait`, `logs -f` and `top` outlive the server's restarts (the pods keep running and are re-adopted),
so they retry for up to `--reconnect` seconds per outage, saying so once on stderr, and give up
(exit 4) only after that. A refusal that retrying cannot fix (a TLS certificate this machine does
not trust) is raised at once.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer

from gpupool.errors import Unavailable

T = TypeVar("T")
DEFAULT_RECONNECT_S = 60.0
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 2.0

ReconnectOption = Annotated[
    float,
    typer.Option("--reconnect", min=0, metavar="SECONDS",
                 help="When the server is unreachable, keep retrying this long before exit 4."),
]


class Reconnecting:
    """Calls through `call()` are retried while the server is unreachable, up to `budget_s` per outage."""

    def __init__(self, budget_s: float = DEFAULT_RECONNECT_S, *, timeout_s: float | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_s = budget_s
        self.timeout_s = timeout_s
        """The command's own --timeout (`wait`), counted from now: no retry goes past it."""
        self._sleep = sleep
        self._clock = clock
        self._until = None if timeout_s is None else clock() + timeout_s
        self.outages = 0

    def call(self, fn: Callable[[], T]) -> T:
        """fn(), retried with backoff while it raises a transient Unavailable; re-raises the last one
        once the budget is spent, or once the command's --timeout has passed when that comes first."""
        deadline: float | None = None
        delay = FIRST_DELAY_S
        while True:
            try:
                return fn()
            except Unavailable as exc:
                if exc.details.get("permanent") or self.budget_s <= 0:
                    raise
                now = self._clock()
                timed_out = self._until is not None and now >= self._until
                if deadline is None:
                    deadline = now + self.budget_s
                    span = f"{self.budget_s:g}"
                    if self._until is not None and self._until < deadline:
                        deadline, span = self._until, f"{round(self._until - now, 1):g}"
                    self.outages += 1
                    if not timed_out:
                        print(f"server unreachable, retrying for up to {span} s...", file=sys.stderr,
                              flush=True)
                if timed_out:
                    raise Unavailable(f"{exc.message.rstrip('.')}; gave up when --timeout "
                                      f"({self.timeout_s:g} s) passed.") from None
                if now >= deadline:
                    raise Unavailable(f"{exc.message.rstrip('.')}; gave up after retrying for "
                                      f"{self.budget_s:g} s (--reconnect).") from None
                self._sleep(min(delay, max(0.0, deadline - now)))
                delay = min(delay * 2, MAX_DELAY_S)
