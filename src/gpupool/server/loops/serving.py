"""The services' controller loop: a thread of its own that runs a pass (serving/controller.py) a few
times a second while services exist, once a second while none do. Probes run in the controller's
prober threads, so a slow replica never holds a pass."""

from __future__ import annotations

import logging
import threading

from gpupool.errors import StoreUnavailable
from gpupool.server.db import Fenced
from gpupool.server.leader import Leadership
from gpupool.server.runtime import Runtime
from gpupool.server.serving.controller import Controller

log = logging.getLogger("gpupool.serving")
PASS_S = 0.2
IDLE_S = 1.0


class ServingLoop:
    def __init__(self, rt: Runtime, leadership: Leadership | None = None) -> None:
        self.rt = rt
        self.leadership = leadership
        """With several servers on one store (docs/ha.md) only the leader's passes run, each one
        fenced by its epoch as the control loop's cycles are: a deposed leader creates no replica."""
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
            epoch: int | None = None
            if self.leadership is not None:
                epoch = self.leadership.acting_epoch()
                if epoch is None:  # a follower: the leader's controller keeps the replicas
                    self._stop.wait(IDLE_S)
                    continue
            try:
                with self.rt.store.fenced(epoch):
                    services = self.controller.step()
            except Fenced:
                if self.leadership is not None and epoch is not None:
                    self.leadership.lost(epoch)
            except StoreUnavailable:  # the store logged the outage once; the next pass tries again
                pass
            except Exception:  # the loop must outlive any one bad pass
                log.exception("services' controller pass failed; trying again")
            self._stop.wait(PASS_S if services else IDLE_S)
