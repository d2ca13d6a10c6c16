"""The actor carrier (`pod_carrier="actor"`, one Ray actor per pod) on the package's Ray cluster.

The group carrier, the default, runs the full suite (test_ray_pool.py); these check what differs:
the pod's actor is placed on the node asked, runs the pod as the pool's account for its tenant and
is released after the pod ends, and a provider of the default carrier re-adopts an actor-carried pod.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("ray", reason="the ray provider needs Ray (pip install 'gpupool[ray]')")

import ray

from gpupool.core.model import Slice
from gpupool.errors import InvalidInput
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.ray import RayProvider
from gpupool.providers.ray import provider as provider_module
from gpupool.providers.ray.nodeconfig import pod_actor_name
from gpupool.providers.ray.settings import NAMESPACE

from .conftest import given_pool_id, wait_for


@pytest.fixture(scope="module")
def actors(pool: RayProvider) -> Iterator[RayProvider]:
    provider = RayProvider(pool.address, data_dir=pool.data_dir, pod_carrier="actor")
    try:
        yield provider
    finally:
        provider.close(stop_pods=True)


def _pod(pod_id: str, node: str, *command: str) -> PodLaunch:
    return PodLaunch(pod_id=pod_id, workload_id="w", node=node, command=command,
                     slices=(Slice(0, 250, 1024),))


def _status(provider: RayProvider, pod_id: str) -> PodStatus:
    return {s.pod_id: s for s in provider.poll()}[pod_id]


def _final(provider: RayProvider, pod_id: str) -> PodStatus:
    status: Any = wait_for(lambda: (s := _status(provider, pod_id)).phase.is_final and s, 90.0,
                           f"{pod_id} to end")
    assert isinstance(status, PodStatus)
    return status


def _actor_gone(provider: RayProvider, pod_id: str) -> bool:
    provider.poll()
    try:
        ray.get_actor(pod_actor_name(pod_id), namespace=NAMESPACE)
    except ValueError:
        return True
    return False


def test_an_unknown_carrier_is_refused_in_one_sentence(tmp_path: Any) -> None:
    with pytest.raises(InvalidInput, match=r"^Unknown Ray pod carrier 'boat'; choose one of group, actor\.$"):
        RayProvider("127.0.0.1:1", data_dir=tmp_path, pod_carrier="boat")


def test_the_pods_actor_runs_it_on_the_node_asked_and_is_released_after(
        pool: RayProvider, actors: RayProvider) -> None:
    actors.launch(_pod("by-actor", "t4-001", "sh", "-c", "echo $GPUPOOL_NODE; sleep 60"))
    wait_for(lambda: _status(actors, "by-actor").phase is PodPhase.RUNNING, 90.0, "the actor's pod to run")
    actor = ray.get_actor(pod_actor_name("by-actor"), namespace=NAMESPACE)
    assert ray.get(actor.node_id.remote()) == pool.membership.ray_node("t4-001").node_id  # type: ignore[union-attr]
    # RUNNING is the shell started, not its echo done: stopped before the echo, the log holds only the
    # shell's "Terminated" (seen on a loaded machine)
    wait_for(lambda: actors.read_log("by-actor").text.startswith("t4-001\n"), what="the pod's first line")
    actors.stop("by-actor", grace_s=5.0)
    assert (_final(actors, "by-actor").phase, _final(actors, "by-actor").exit_code) == (PodPhase.STOPPED, 143)
    wait_for(lambda: _actor_gone(actors, "by-actor"), what="the finished pod's actor to be released")
    assert actors.read_log("by-actor").text.startswith("t4-001\n")  # from the node agent now


@pytest.mark.skipif(os.geteuid() != 0, reason="pods run as other accounts only under root")
def test_an_actor_carried_pod_runs_as_the_pools_account_for_its_tenant(
        pool: RayProvider, actors: RayProvider) -> None:
    pool_id = given_pool_id(pool)
    for pod_id, on_behalf, account in (("who-actor", False, f"gpupool-{pool_id}-acme"),
                                       ("who-actor-ob", True, f"gpupool-{pool_id}-acme_ob")):
        actors.launch(PodLaunch(pod_id=pod_id, workload_id="w", node="t4-002", command=("id", "-un"),
                                slices=(Slice(0, 250, 1024),), tenant="acme", on_behalf=on_behalf))
        assert _final(actors, pod_id).phase is PodPhase.SUCCEEDED
        assert actors.read_log(pod_id).text == f"{account}\n"


def test_a_log_read_that_meets_the_pods_release_is_answered_by_the_node_agent(
        actors: RayProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    """The monitor may release a finished pod (its actor shuts down) after `read_log` chose to ask
    the actor and before the call reaches it: the read is then answered from the node agent, where
    a released pod's log is read, not failed with the actor's death (seen once in a full run)."""
    monkeypatch.setattr(provider_module, "RELEASE_AFTER_POLLS", 10**9)  # only the race releases it
    actors.launch(_pod("raced", "t4-000", "sh", "-c", "echo raced-out"))
    assert _final(actors, "raced").phase is PodPhase.SUCCEEDED
    carrier = actors._carriers[actors._pods["raced"].carrier]
    asked = carrier.log_ref
    raced: list[str] = []

    def released_meanwhile(tracked: Any, stream: str, offset: int) -> Any:
        if tracked.released:
            return asked(tracked, stream, offset)
        actor = tracked.actor
        carrier.release(tracked)  # what the monitor does, between the check and the call
        wait_for(lambda: _actor_gone(actors, "raced"), what="the released pod's actor to exit")
        raced.append(tracked.pod_id)
        return actor.read_log.remote(stream, offset)

    monkeypatch.setattr(carrier, "log_ref", released_meanwhile)
    assert actors.read_log("raced").text == "raced-out\n"
    assert raced == ["raced"]


def test_a_provider_of_the_default_carrier_re_adopts_an_actor_carried_pod(actors: RayProvider) -> None:
    actors.launch(_pod("mixed", "t4-000", "sleep", "60"))
    wait_for(lambda: _status(actors, "mixed").phase is PodPhase.RUNNING, 90.0, "the actor's pod to run")
    groups = RayProvider(actors.address, data_dir=actors.data_dir)
    try:
        assert groups.pod_carrier == "group" and _status(groups, "mixed").phase is PodPhase.RUNNING
        groups.stop("mixed", grace_s=2.0)
        assert (_final(groups, "mixed").phase, _final(groups, "mixed").exit_code) == (PodPhase.STOPPED, 143)
    finally:
        groups.close()
