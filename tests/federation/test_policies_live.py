"""Policies other than `home` through a live `gpupool up --federation`: two member pools (east, alice's
and dana's home, at 1.0 a GPU-hour; west at 0.9, holding data set `corpus`) and a hub on loopback,
one set for the module. Under `cheapest` alice's work goes west; under `data-local` dana's work goes
where its data set is, and a data set no member holds is refused with the reason."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpupool.client import Client
from gpupool.federation.loopback import Federation, copies, start_federation, until
from gpupool.federation.placement import DATASET_ENV
from ports import free_port
from server.upproc import spawn_gpupool

pytestmark = pytest.mark.slow
LONG = {"GPUPOOL_FAKE_DURATION_S": "3600"}


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    federation = start_federation(tmp_path_factory.mktemp("fedpol"), ("east", "west"), policy="cheapest",
                                  tenants={"dana": "data-local"}, datasets={"corpus": (50.0, "west")},
                                  free_port=free_port,
                                  spawn=spawn_gpupool)
    yield federation
    federation.stop()


def _messages(pool: Client, workload_id: str, reason: str) -> list[str]:
    return [e.message for e in pool.events(workload_id) if e.reason == reason]


def test_cheapest_puts_work_on_the_cheaper_member(fed: Federation) -> None:
    assert fed.hub is not None
    with Client(fed.hub.url, fed.alice_token) as pool:
        workload_id = pool.submit(command=["train"], gpus=1, env=LONG)
        until(lambda: pool.workload(workload_id).status == "running", 30, "placed and running")
        placed = until(lambda: _messages(pool, workload_id, "federation_placed"), 10, "placed event")
        assert "offered to west under cheapest" in placed[0]
        assert len(copies(fed.member("west"))[workload_id]) == 1
        assert workload_id not in copies(fed.member("east"))  # home, but dearer
        pool.cancel(workload_id)
    until(lambda: workload_id not in copies(fed.member("west")), 10, "cancelled on west too")


def test_data_local_follows_the_data_and_refuses_a_set_no_member_holds(fed: Federation) -> None:
    assert fed.hub is not None
    with Client(fed.hub.url, fed.tokens["dana"]) as pool:
        held = pool.submit(command=["train"], gpus=1, env={**LONG, DATASET_ENV: "corpus"})
        nowhere = pool.submit(command=["train"], gpus=1, env={**LONG, DATASET_ENV: "lost-set"})
        until(lambda: pool.workload(held).status == "running", 30, "the corpus job running")
        assert len(copies(fed.member("west"))[held]) == 1  # where corpus is, not dana's home east
        refused = until(lambda: _messages(pool, nowhere, "federation_unplaceable"), 10, "refusal event")
        assert "no member can take it under data-local" in refused[0]
        for member in ("east", "west"):
            assert (f"{member}: policy data-local runs work only where its data set 'lost-set' is held"
                    in refused[0])
        assert pool.workload(nowhere).status == "pending"
        assert all(nowhere not in copies(fed.member(m), active_only=False) for m in ("east", "west"))
        pool.cancel(held)
        pool.cancel(nowhere)
