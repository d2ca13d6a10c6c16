"""A gang's topology constraint from `gpupool submit --topology` through the API (one-sentence 422s),
stored in the spec and handed to the core, which then waits or spreads as it says."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fabric_pool import Pool

from gpupool.cli.submit_fast import parse
from gpupool.core.topology_spec import Tier, TopologySpec


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    made = Pool(tmp_path)
    yield made
    made.close()


def test_the_cli_puts_the_constraint_in_the_spec() -> None:
    spec = parse(["--replicas", "4", "--topology", "slice=2@leaf", "--", "train"])
    assert spec["topology"] == "slice=2@leaf"


@pytest.mark.parametrize(("asked", "says"), [
    ("required=rack", "Unknown topology tier 'rack' in required=; use leaf or spine."),
    ("required=leaf,preferred=spine", "A topology constraint is either required or preferred, not both"),
    ("slice=four@leaf", "slice= needs a pod count such as slice=4@leaf"),
    ("comm=heavy", "comm= needs a number such as comm=1.5"),
])
def test_a_bad_constraint_is_refused_in_one_sentence(pool: Pool, asked: str, says: str) -> None:
    answer = pool.call("post", "/workloads", {"command": ["train"], "replicas": 2, "topology": asked})
    assert answer.status_code == 422
    message = answer.json()["message"]
    assert message.startswith("Field 'topology' ") and says.lower() in message.lower()
    assert message.count(". ") <= 1 and "Traceback" not in message


def test_the_constraint_is_stored_and_reaches_the_core(pool: Pool) -> None:
    gang = pool.gang(replicas=2, topology="Required=Leaf")
    assert pool.detail(gang)["spec"]["topology"] == "required=leaf"  # its one written form
    workload = pool.loop.scheduler.cache.peek(gang)
    assert workload is not None and workload.topology == TopologySpec(required=Tier.LEAF)


def test_a_stated_communication_ratio_is_stored_and_reaches_the_scheduler(pool: Pool) -> None:
    gang = pool.gang(replicas=2, topology="COMM=1.50")
    assert pool.detail(gang)["spec"]["topology"] == "comm=1.5"
    workload = pool.loop.scheduler.cache.peek(gang)
    assert workload is not None and workload.topology == TopologySpec(comm_ratio=1.5)
    view = pool.loop.scheduler.keeper.view
    context = view.topology_context() if view is not None else None
    assert context is not None and context.comm_ratio(workload) == 1.5  # what the policies read


def test_required_leaf_waits_where_none_spreads(pool: Pool) -> None:
    evens = [f"node{i:05d}" for i in (2, 4, 6, 8)]
    for name in evens:
        pool.call("post", f"/nodes/{name}/cordon")
    for _ in range(4):  # one whole node busy under each leaf: node00001, 3, 5 and 7
        pool.gang(replicas=1)
    for name in evens:
        pool.call("post", f"/nodes/{name}/uncordon")
    strict = pool.gang(replicas=2, topology="required=leaf")  # a leaf could hold it, none can now
    assert (pool.detail(strict)["status"], pool.detail(strict)["reason"]) == ("pending", "no_domain_fits")
    spread = pool.gang(replicas=2, topology="none")
    assert pool.detail(spread)["status"] == "running"
    assert pool.detail(spread)["network"]["domain"] == "spine"


def test_a_gang_no_leaf_could_ever_hold_under_required_leaf_fails(pool: Pool) -> None:
    never = pool.gang(replicas=3, topology="required=leaf")  # leaves have 2 hosts
    assert (pool.detail(never)["status"], pool.detail(never)["reason"]) == ("failed", "never_fits")


@pytest.mark.parametrize("cap", ["fixed", "loss", "queue"])
def test_the_pools_wait_cap_decides_whether_a_long_gang_waits_an_hour_for_its_leaf(
    tmp_path: Path, cap: str
) -> None:
    """Every leaf has one node busy for an hour. A ten-hour communication-heavy gang could start now
    only across the spine: under the default cap (300 s) it spreads at once; with
    `topology_wait_cap: loss` it waits for a leaf, since spreading would cost it more than the hour
    (and under `queue`, with nothing queued behind it, the same)."""
    config = f"scheduling: {{placement: network-aware, backfill: false, topology_wait_cap: {cap}}}\n"
    pool = Pool(tmp_path, config=config)
    try:
        evens = [f"node{i:05d}" for i in (2, 4, 6, 8)]
        for name in evens:
            pool.call("post", f"/nodes/{name}/cordon")
        for _ in range(4):
            pool.gang(replicas=1, runtime_estimate_s=3600.0)
        for name in evens:
            pool.call("post", f"/nodes/{name}/uncordon")
        gang = pool.gang(replicas=2, topology="preferred=leaf,comm=4", runtime_estimate_s=36_000.0)
        detail = pool.detail(gang)
        if cap == "fixed":
            assert detail["status"] == "running" and detail["network"]["domain"] == "spine"
            return
        assert (detail["status"], detail["reason"]) == ("pending", "waiting_for_locality")
        message = detail["message"]
        assert "a leaf of its own is expected in 3600 s" in message
        loss = message.split("less than the ")[1].split(" s spreading")[0]
        assert int(loss) > 3600 and f"it waits (at most {loss} s in all)" in message
    finally:
        pool.close()
