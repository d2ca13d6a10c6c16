"""Which replicas a scale-down removes (server/serving/controller.py `plan`): not serving first, then,
with `serving.pack_replicas`, the serving ones on the emptiest node (the core's `emptiest_first`), so a
node the service leaves comes whole again for wide batch gangs; without it the newest first."""

from __future__ import annotations

from gpupool.server.serving.controller import Replica, plan


def replica(wid: str, node: str, ready: str = "ready") -> Replica:
    return Replica(wid, 1, 22000, "10.0.0.1", ready, 0, "", "running", 0.0, node, f"p-{wid}")


ACTIVE = [replica("a", "n1"), replica("b", "n2"), replica("c", "n1"), replica("d", "n3", ready="starting")]
USED = {"n1": 6.0, "n2": 1.0, "n3": 8.0}  # n2 holds only b: removing it frees the node


def test_a_scale_down_removes_the_replica_on_the_emptiest_node() -> None:
    remove, create = plan(2, 1, 1, 0, ACTIVE, USED)
    assert ([r.workload_id for r in remove], create) == (["d", "b"], 0)  # the starting one, then n2's


def test_without_packing_the_newest_serving_replica_goes() -> None:
    remove, _ = plan(2, 1, 1, 0, ACTIVE)
    assert [r.workload_id for r in remove] == ["d", "c"]


def test_the_configuration_turns_it_off() -> None:
    from gpupool.config import PoolConfig

    assert PoolConfig().serving.pack_replicas is True
    assert PoolConfig.model_validate({"serving": {"pack_replicas": False}}).serving.pack_replicas is False
