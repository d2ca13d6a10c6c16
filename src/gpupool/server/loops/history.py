"""The history sampler: a thread of its own that records the pool once a minute (services/history.py),
outside the control loop and its transactions, then rolls up and expires the old rows once an hour."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpupool.errors import StoreUnavailable
from gpupool.server.runtime import Runtime
from gpupool.server.services import history

log = logging.getLogger("gpupool.history")


class HistorySampler:
    """Samples at start, then just after each minute begins (on the runtime's clock)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_minute = -1.0
        self._last_hour = -1.0
        self.extra: Callable[[], list[history.Point]] | None = None
        """More points each minute (each service's: serving/history.py, set by the app)."""

    @property
    def enabled(self) -> bool:
        return self.rt.settings.history_days > 0

    def start(self) -> None:
        if not self.enabled:
            return
        self._thread = threading.Thread(target=self._run, name="gpupool-history", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def step(self, now: float) -> int:
        """Record the minute `now` falls in (once), and once an hour roll up and expire; the rows written."""
        minute = history.minute_of(now)
        written = 0
        if minute != self._last_minute:
            extra = self.extra() if self.extra else None
            written = history.record(self.rt, minute, history.sample(self.rt, extra))
            self._last_minute = minute
        hour = minute // history.HOUR_S
        if hour != self._last_hour:
            history.roll_up(self.rt, now)
            history.expire(self.rt, now, self.rt.settings.history_days)
            self._last_hour = hour
        return written

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step(self.rt.clock())
            except StoreUnavailable:  # the store logged the outage once; the next minute tries again
                pass
            except Exception:  # the sampler must outlive any one bad minute
                log.exception("history sample failed; trying again next minute")
            now = self.rt.clock()
            self._stop.wait(history.MINUTE_S - (now % history.MINUTE_S) + 0.5)
