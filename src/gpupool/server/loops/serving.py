"""The services' controller loop: a thread of its own that runs a pass (serving/controller.py) a few
times a second while services exist, once a second while none do. Probes run in the controller's
prober threads, so a slow replica never holds a pass."""

from __future__ import annotations

import logging
import threading

from gpupool.errors import StoreUnavailable
from gpupool.server.runtime import Runtime
from gpupool.server.serving.controller import Controller

log = logging.getLogger("gpupool.serving")
PASS_S = 0.2
IDLE_S = 1.0


class ServingLoop:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.controller = Controller(rt)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpupool-serving", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.controller.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            services = 1
            try:
                services = self.controller.step()
            except StoreUnavailable:  # the store logged the outage once; the next pass tries again
                pass
            except Exception:  # the loop must outlive any one bad pass
                log.exception("services' controller pass failed; trying again")
            self._stop.wait(PASS_S if services else IDLE_S)
