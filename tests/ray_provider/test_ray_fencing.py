"""Epoch fencing on Ray nodes (`gpupool up --ha` with the ray provider): once a new leader announced
its epoch, a node refuses a launch of an older one, whichever carrier delivers it (agent/fencing.py).

Runs on the package's cluster (conftest.pool) before test_ray_pool.py kills a node; launches without
an epoch (a single server) are never fenced, so the fence it leaves on the nodes changes no other test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="the ray provider needs Ray (pip install 'gpupool[ray]')")

import ray

from gpupool.core.model import Slice
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.ray import RayProvider
from gpupool.providers.ray.nodeconfig import node_agent_name
from gpupool.providers.ray.settings import NAMESPACE

from .conftest import wait_for


def _pod(pod_id: str, command: str, epoch: int) -> PodLaunch:
    return PodLaunch(pod_id=pod_id, workload_id=pod_id, node="t4-002", command=("sh", "-c", command),
                     slices=(Slice(0, 250, 1024),), epoch=epoch)


def _final(provider: RayProvider, pod_id: str) -> PodStatus:
    status: Any = wait_for(lambda: (s := {s.pod_id: s for s in provider.poll()}[pod_id]).phase.is_final and s,
                           90.0, f"{pod_id} to end")
    assert isinstance(status, PodStatus)
    return status


def _held(node: str) -> int:
    """The epoch a node's agent holds (an older-epoch no-op announcement answers it)."""
    return int(ray.get(ray.get_actor(node_agent_name(node), namespace=NAMESPACE).fence.remote(0)))


@pytest.fixture(scope="module")
def marks(pod_scratch_root: Path) -> Iterator[Path]:
    directory = pod_scratch_root / "fence-marks"  # pods run as another account: tmp_path is closed to it
    directory.mkdir()
    directory.chmod(0o777)
    yield directory


@pytest.mark.parametrize("carrier", ["group", "actor"])
def test_a_node_refuses_a_launch_of_an_epoch_older_than_the_one_announced(
        pool: RayProvider, marks: Path, carrier: str) -> None:
    provider = pool if carrier == "group" else RayProvider(pool.address, data_dir=pool.data_dir,
                                                           pod_carrier="actor")
    try:
        provider.fence(7)  # a new leader's takeover at epoch 7
        assert {_held(n.name) for n in provider.nodes()} == {7}
        provider.launch(_pod(f"stale-{carrier}", f"touch {marks}/stale-{carrier}; sleep 30", epoch=6))
        refused = _final(provider, f"stale-{carrier}")
        assert refused.phase is PodPhase.FAILED and "epoch 7 has taken over" in refused.message, refused
        provider.launch(_pod(f"current-{carrier}", f"touch {marks}/current-{carrier}", epoch=7))
        assert _final(provider, f"current-{carrier}").phase is PodPhase.SUCCEEDED
        assert (marks / f"current-{carrier}").exists()
        assert not (marks / f"stale-{carrier}").exists()  # the deposed leader's command never ran
    finally:
        if provider is not pool:
            provider.close(stop_pods=True)


def test_a_node_holding_a_higher_epoch_is_set_back_only_once_the_store_confirms(pool: RayProvider) -> None:
    pool.fence(9)

    def stale() -> None:
        raise RuntimeError("epoch 3 is no longer the store's")

    with pytest.raises(RuntimeError):
        pool.fence(3, confirm=stale)  # a deposed leader: the nodes keep the newer epoch
    assert {_held(n.name) for n in pool.nodes()} == {9}
    pool.fence(3, confirm=lambda: None)  # a store made afresh, whose lease is at epoch 3
    assert {_held(n.name) for n in pool.nodes()} == {3}
