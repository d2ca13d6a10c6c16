"""A server over a small generated fat tree (`gpupool up --fabric FILE`), its loop stepped by the test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes import ManualProvider
from fastapi.testclient import TestClient

from gpupool.config import parse_config
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.write import to_ibnetdiscover
from gpupool.core.model import Device, Node
from gpupool.server.app import create_app
from gpupool.server.db import Store
from gpupool.server.loops.control import ControlLoop
from gpupool.server.runtime import Runtime
from gpupool.server.services.fabric import open_live_fabric
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

CONFIG = "scheduling: {placement: first-fit, backfill: false}\n"
HOSTS = 8  # fat_tree(4): 4 leaves of 2 hosts, 2 spines


def _node(name: str) -> Node:
    devices = tuple(Device(uuid=f"{name}-d{i}", model="H100", index=i) for i in range(2))
    return Node(name=name, cpu_milli=8000, memory_mib=65_536, devices=devices)


class Pool:
    """A server on a hand-driven provider and a fabric file, its loop stepped by the test."""

    def __init__(self, tmp_path: Path, config: str = CONFIG, fabric: bool = True,
                 provider: type[ManualProvider] = ManualProvider) -> None:
        self.now = 1_000_000.0
        path = tmp_path / "tree.topo"
        path.write_text(to_ibnetdiscover(fat_tree(4, levels=2)))
        self.provider = provider([_node(f"node{i:05d}") for i in range(1, HOSTS + 1)])
        url = f"sqlite:///{tmp_path / 'store.sqlite'}"
        settings = Settings(data_dir=tmp_path, database_url=url, cycle_interval_s=0.05)
        self.rt = Runtime(settings=settings, store=Store.open(url), provider=self.provider,
                          clock=lambda: self.now, config=parse_config(config))
        if fabric:
            self.rt.fabric = open_live_fabric(path, self.rt.nodes())
        self.admin = bootstrap(self.rt) or ""
        self.client = TestClient(create_app(self.rt, run_loop=False))
        self.client.__enter__()
        self.loop = ControlLoop(self.rt)
        self.loop.recovered = self.loop.reconciler.recover()
        created = self.call("post", "/tenants", {"name": "team-a"})
        assert created.status_code == 201, created.text
        self.tenant = self.call("post", "/tokens", {"tenant": "team-a"}).json()["token"]

    def call(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {token or self.admin}"}
        return self.client.request(method, f"/api/v1{path}", json=body, headers=headers)

    def gang(self, replicas: int = 3, token: str | None = None, **extra: Any) -> str:
        """A gang of whole nodes (2 devices each): 3 of them cannot sit under one leaf of 2 hosts."""
        answer = self.call("post", "/workloads", {"command": ["train"], "replicas": replicas,
                                                  "resources": {"gpus": 2}, **extra}, token)
        assert answer.status_code == 201, answer.text
        self.loop.step()
        return str(answer.json()["id"])

    def detail(self, workload_id: str) -> dict[str, Any]:
        return dict(self.call("get", f"/workloads/{workload_id}").json())

    def events(self, workload_id: str) -> list[tuple[str, str]]:
        answer = self.call("get", f"/workloads/{workload_id}/events").json()
        return [(e["reason"], e["message"]) for e in answer]

    def close(self) -> None:
        self.client.__exit__(None, None, None)
        self.rt.store.close()
