"""What a prefill/decode pair's replicas are launched with, on a hand-stepped server: with a fabric
their HCAs (NCCL_IB_HCA, UCX_NET_DEVICES) and their class's NCCL_IB_SL; without one, only the role
and the partner (nothing about a fabric, and no complaint); an unpaired replica gets none of it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fabric_pool import CONFIG, Pool
from sqlalchemy import create_engine, text

from conftest import Server, start_server, stop_server
from gpupool.api.services import ServiceSpec
from gpupool.errors import InvalidInput
from gpupool.pods import PodLaunch
from gpupool.server import pgtemp
from gpupool.server.auth import Principal
from gpupool.server.serving import services as cases
from gpupool.server.serving.controller import Controller

QOS_CONFIG = (f"{CONFIG}fabric:\n  qos: {{serving: 0.6, normal: 0.4}}\n")
PAIR_VARS = ("GPUPOOL_SERVICE_ROLE", "GPUPOOL_PAIR_WITH", "GPUPOOL_PARTNER_ENDPOINTS")
FABRIC_VARS = ("NCCL_IB_HCA", "UCX_NET_DEVICES", "NCCL_IB_SL")


def launched(pool: Pool, services: dict[str, dict[str, object]]) -> dict[str, PodLaunch]:
    """Create the services (tenant team-a), let the controller make their replicas and the loop
    launch them; each service's one launch by name."""
    for name, extra in services.items():
        answer = pool.call("post", "/services", {"name": name, "command": ["serve"],
                                                 "resources": {"gpus": 0.25}, **extra}, pool.tenant)
        assert answer.status_code == 201, answer.text
    controller = Controller(pool.rt)
    try:
        controller.step()
    finally:
        controller.close()
    pool.loop.step()
    by_name = {pod.env["GPUPOOL_WORKLOAD_ID"]: pod for pod in pool.provider.launched.values()}
    out = {}
    for name in services:
        replicas = pool.call("get", f"/services/{name}", token=pool.tenant).json()["replicas"]
        out[name] = by_name[replicas[0]["workload_id"]]
    return out


@pytest.fixture
def fabric_pool(tmp_path: Path) -> Iterator[Pool]:
    pool = Pool(tmp_path, QOS_CONFIG)
    yield pool
    pool.close()


@pytest.fixture
def plain_pool(tmp_path: Path) -> Iterator[Pool]:
    pool = Pool(tmp_path, QOS_CONFIG, fabric=False)
    yield pool
    pool.close()


PAIR = {"dec": {"role": "decode", "pair_with": "pre"}, "pre": {"role": "prefill", "pair_with": "dec"},
        "solo": {}}


def test_with_a_fabric_a_paired_replica_gets_its_hcas_and_service_level(fabric_pool: Pool) -> None:
    pods = launched(fabric_pool, PAIR)
    env = pods["pre"].env
    assert env["GPUPOOL_SERVICE_ROLE"] == "prefill" and env["GPUPOOL_PAIR_WITH"] == "dec"
    assert env["GPUPOOL_PARTNER_ENDPOINTS"] == ""  # no decode replica is ready yet
    assert env["NCCL_IB_HCA"].startswith("=") and env["UCX_NET_DEVICES"] == env["NCCL_IB_HCA"][1:]
    sl = fabric_pool.rt.config.fabric.service_level("serving")
    assert sl is not None and env["NCCL_IB_SL"] == str(sl)
    assert pods["dec"].env["GPUPOOL_SERVICE_ROLE"] == "decode"
    assert not set(PAIR_VARS + FABRIC_VARS) & set(pods["solo"].env)  # an unpaired replica: none of it


def test_without_a_fabric_only_the_role_and_partner_are_set(plain_pool: Pool) -> None:
    pods = launched(plain_pool, PAIR)
    env = pods["pre"].env
    assert env["GPUPOOL_SERVICE_ROLE"] == "prefill" and "GPUPOOL_PARTNER_ENDPOINTS" in env
    assert "NCCL_IB_HCA" not in env and "UCX_NET_DEVICES" not in env  # no IB ports, no fabric
    assert not set(PAIR_VARS + FABRIC_VARS) & set(pods["solo"].env)


def test_two_halves_created_at_once_on_postgresql_are_checked_one_after_the_other(
        tmp_path: Path, postgres: pgtemp.TempPostgres, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both say prefill: the second, racing the first's open transaction, waits for the tenant's row
    and is refused once it sees the first's role (without the lock both would be stored)."""
    server = start_server(tmp_path, postgres.create_database())
    try:
        created = server.client.post("/api/v1/tenants", json={"name": "alpha"}, headers=server.headers())
        assert created.status_code == 201, created.text
        who = Principal(token_id="t", tenant="alpha", max_priority=None)
        spec = {"command": ["serve"], "role": "prefill", "min_replicas": 0, "replicas": 0}
        outcome: list[str] = []

        def second() -> None:
            try:
                half = ServiceSpec.model_validate({**spec, "name": "b", "pair_with": "a"})
                cases.create(server.rt, who, half)
                outcome.append("stored")
            except InvalidInput as exc:
                outcome.append(exc.message)

        racer = threading.Thread(target=second, daemon=True)
        original = cases.check_partner

        def racing(*args: Any) -> None:
            original(*args)
            if racer.ident is None:  # the first create, its tenant row locked: the second starts now
                racer.start()
                wait_for_a_lock_or_the_end(postgres_url(server), racer)

        monkeypatch.setattr(cases, "check_partner", racing)
        cases.create(server.rt, who, ServiceSpec.model_validate({**spec, "name": "a", "pair_with": "b"}))
        racer.join(timeout=60)
        assert len(outcome) == 1 and "has role prefill" in outcome[0], outcome
    finally:
        stop_server(server)


def postgres_url(server: Server) -> str:
    return str(server.rt.store.engine.url.render_as_string(hide_password=False))


def wait_for_a_lock_or_the_end(url: str, thread: threading.Thread) -> None:
    """Return once PostgreSQL shows a transaction waiting for a lock, or `thread` has ended."""
    engine = create_engine(url)
    waiting = text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                   "AND datname = current_database()")
    try:
        with engine.connect() as watch:
            while thread.is_alive() and not watch.execute(waiting).scalar():
                watch.rollback()  # a fresh snapshot of the activity view each time
                time.sleep(0.005)
    finally:
        engine.dispose()
