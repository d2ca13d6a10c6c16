"""Concurrent submitters never push a queue past its quota: checked at every launch."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
from fakes import ManualProvider

from factories import node
from gpupool.pods import PodLaunch
from live import live_server

QUOTA_MILLI = 2000


class QuotaWatchingProvider(ManualProvider):
    """Records the peak device share its running pods of one tenant held at any launch."""

    def __init__(self) -> None:
        super().__init__([node("n0", devices=8, model="H100")])
        self.peak_milli = 0

    def launch(self, pod: PodLaunch) -> None:
        super().launch(pod)
        running = set(self.running())
        held = sum(
            s.compute_milli
            for p in self.launched.values()
            if p.pod_id in running and p.env.get("GPUPOOL_TENANT") == "team-a"
            for s in p.slices
        )
        self.peak_milli = max(self.peak_milli, held)


def test_concurrent_submitters_stay_within_quota(tmp_path: Path) -> None:
    provider = QuotaWatchingProvider()
    with live_server(tmp_path, provider) as srv:
        admin = httpx.Client(
            base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {srv.admin_token}"}
        )
        admin.post("/tenants", json={"name": "team-a"}).raise_for_status()
        admin.post("/queues", json={"tenant": "team-a", "name": "q", "quota_gpus": 2}).raise_for_status()
        token = admin.post("/tokens", json={"tenant": "team-a"}).json()["token"]
        ids: list[str] = []
        lock = threading.Lock()

        def submitter() -> None:
            with httpx.Client(
                base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}
            ) as c:
                for _ in range(8):
                    answer = c.post(
                        "/workloads", json={"command": ["x"], "queue": "q", "resources": {"gpus": 0.5}}
                    )
                    answer.raise_for_status()
                    with lock:
                        ids.append(answer.json()["id"])

        threads = [threading.Thread(target=submitter) for _ in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for pod_id in provider.running()[:2]:
                provider.finish(pod_id, 0)
            done = admin.get("/workloads", params={"status": "succeeded", "limit": 1}).json()["total"]
            if done == 48 and not any(t.is_alive() for t in threads):
                break
            time.sleep(0.02)
        for t in threads:
            t.join()
        assert len(ids) == 48 and done == 48
        assert 0 < provider.peak_milli <= QUOTA_MILLI
        admin.close()
