"""A monotonic clock a test holds still and moves itself, for code that times out or ages work on
`time.monotonic` (patch the module's `time` with it): a deadline or an age is then what the test
made it, however long the machine stalls a thread."""

from __future__ import annotations

import time


class HeldClock:
    """`time`, but `monotonic()` returns `now`, which only the test changes."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)
