"""What a prefill/decode pair's replicas are launched with, on a hand-stepped server: with a fabric
their HCAs (NCCL_IB_HCA, UCX_NET_DEVICES) and their class's NCCL_IB_SL; without one, only the role
and the partner (nothing about a fabric, and no complaint); an unpaired replica gets none of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fabric_pool import CONFIG, Pool

from gpupool.pods import PodLaunch
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
