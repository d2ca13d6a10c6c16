"""A service whose replicas crash is backed off, as Kubernetes backs off a crashing container: the
first replacement at once, then 10 s, 20 s, ... at most 300 s between replicas, with the service
degraded and its error the last replica's exit; a replica that ran 10 minutes is no crash. Before,
a replica that died at start was replaced on every pass (271 workloads in a minute for one service
of one or two replicas), and `service ls` said `pending` with no error."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dataplane_replicas import Replica
from fabric_pool import Pool

from gpupool.server.serving.controller import Controller, backoff_s


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    pool = Pool(tmp_path, fabric=False)
    yield pool
    pool.close()


def test_the_wait_doubles_from_the_second_crash_up_to_five_minutes() -> None:
    assert [backoff_s(n) for n in range(1, 9)] == [0, 10, 20, 40, 80, 160, 300, 300]


class Service:
    """Service `web` of team-a, its controller and loop stepped by hand on the pool's clock."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        answer = pool.call("post", "/services", {"name": "web", "command": ["serve"],
                                                 "resources": {"gpus": 0.25}}, pool.tenant)
        assert answer.status_code == 201, answer.text
        self.controller = Controller(pool.rt)

    def step(self) -> None:
        self.controller.step()
        self.pool.loop.step()

    def shown(self) -> dict[str, Any]:
        return dict(self.pool.call("get", "/services/web", token=self.pool.tenant).json())

    def replicas(self) -> list[str]:
        return [r["workload_id"] for r in self.shown()["replicas"]]

    def crash(self, after_s: float = 1.0) -> str:
        """The one replica's pod runs `after_s`, then exits with code 2; its workload id."""
        [replica] = self.replicas()
        [pod_id] = [p for p, launch in self.pool.provider.launched.items()
                    if launch.workload_id == replica and p in self.pool.provider.running()]
        self.pool.now += after_s
        self.pool.provider.finish(pod_id, exit_code=2)
        self.pool.loop.step()  # its end recorded
        return replica

    def serve(self) -> None:
        """The one replica answers its readiness probe (on its $PORT) until it is ready."""
        [replica] = self.replicas()
        [port] = [int(launch.env["PORT"]) for launch in self.pool.provider.launched.values()
                  if launch.workload_id == replica]
        listener = Replica(replica, port)
        try:
            deadline = time.monotonic() + 30
            while self.shown()["replicas"][0]["ready"] != "ready":
                assert time.monotonic() < deadline, self.shown()
                self.pool.now += 2.0  # a probe period
                self.controller.step()
                time.sleep(0.02)
        finally:
            listener.close()

    def waits(self, seconds: float) -> None:
        """No replica while the clock moves on for `seconds` less one; then one, launched."""
        self.pool.now += seconds - 1
        self.step()
        assert self.replicas() == [], self.shown()
        self.pool.now += 1
        self.step()
        assert len(self.replicas()) == 1, self.shown()


def test_a_service_whose_replicas_crash_is_backed_off_and_degraded_with_the_exit(pool: Pool) -> None:
    service = Service(pool)
    try:
        service.step()
        first = service.crash()
        service.step()  # the first crash: replaced at once
        assert len(service.replicas()) == 1 and service.replicas() != [first]
        service.crash()
        service.waits(10)
        shown = service.shown()
        assert shown["state"] == "degraded" and "its replicas crash: 2 in a row" in shown["last_probe_error"]
        assert "exit" in shown["last_probe_error"] or "code 2" in shown["last_probe_error"], shown
        said = [e["message"] for e in shown["events"] if e["reason"] == "replica_replaced"]
        assert "the 2nd in a row to end within 10 minutes of starting; the next replica starts in 10 s" \
            in said[-1], said
        service.crash()
        service.waits(20)
        service.serve()  # one made since the last crash serves: that was no loop (any more)
        service.crash()  # the first crash of a new count: replaced at once
        service.step()
        assert len(service.replicas()) == 1, service.shown()
        service.crash()
        service.waits(10)  # the second
        service.crash(after_s=600)  # it ran ten minutes: no crash, replaced at once
        service.step()
        assert len(service.replicas()) == 1
        service.crash()  # the count starts again: the first crash, replaced at once
        service.step()
        assert len(service.replicas()) == 1
    finally:
        service.controller.close()
