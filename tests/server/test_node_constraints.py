"""Node constraints through the server, on a hand-driven pool of two nodes where only the second can
run containers: image work lands there alone (first-fit would take the first node), a constraint
no node meets is refused at submit naming the labels there are, work whose labelled nodes are full
waits saying so, and an image in use cannot be removed."""

from __future__ import annotations

import dataclasses
import io
import tarfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fakes import ManualProvider

from conftest import Server, start_server, stop_server
from factories import node
from gpupool.cli.submit_fast import parse
from gpupool.providers.nodespec import CONTAINERS_LABEL

API = "/api/v1"


def _archive() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("etc/os-release")
        info.size = 10
        archive.addfile(info, io.BytesIO(b"NAME=tiny\n"))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    tmp = tmp_path_factory.mktemp("constraints")
    plain = replace(node("n0", devices=8, model="H100"), labels={"zone": "a"})
    crun = replace(node("n1", devices=4, model="H100"), labels={CONTAINERS_LABEL: "crun 1.8.1", "zone": "b"})
    server = start_server(tmp / "data", provider=ManualProvider([plain, crun]))
    server.rt.settings = dataclasses.replace(server.rt.settings, image_dir=tmp / "images")
    answer = server.client.post(f"{API}/images", params={"name": "tiny"}, content=_archive(),
                                headers=server.headers())
    assert answer.status_code == 201, answer.text
    server.created("/tenants", {"name": "team-a"})
    token = str(server.created("/tokens", {"tenant": "team-a", "name": "t"})["token"])
    yield server, token
    stop_server(server)


def _submit(server: Server, token: str, **spec: Any) -> Any:
    return server.client.post(f"{API}/workloads", json={"command": ["true"], **spec},
                              headers=server.headers(token))


def _launched_nodes(server: Server, ids: list[str]) -> dict[str, str]:
    server.wait_for(lambda: {p.workload_id for p in server.provider.launched.values()} >= set(ids))
    return {p.workload_id: p.node for p in server.provider.launched.values() if p.workload_id in ids}


def _finish(server: Server, ids: list[str]) -> None:
    for pod in list(server.provider.launched.values()):
        if pod.workload_id in ids:
            server.provider.finish(pod.pod_id)
    server.wait_for(lambda: all(server.status(w) == "succeeded" for w in ids))


def test_image_work_lands_only_on_the_node_that_runs_containers(pool: tuple[Server, str]) -> None:
    server, token = pool
    ids = []
    for _ in range(3):  # first-fit would put every one of them on n0
        answer = _submit(server, token, image="tiny", resources={"gpus": 1})
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    assert set(_launched_nodes(server, ids).values()) == {"n1"}
    stored = server.client.get(f"{API}/workloads/{ids[0]}", headers=server.headers(token)).json()
    assert stored["spec"]["constraints"] == []  # the containers label is implied, never stored
    _finish(server, ids)


def test_a_constraint_lands_on_the_nodes_carrying_it(pool: tuple[Server, str]) -> None:
    server, token = pool
    answer = _submit(server, token, constraints=["zone=b"], resources={"gpus": 1})
    assert answer.status_code == 201, answer.text
    wid = answer.json()["id"]
    assert _launched_nodes(server, [wid]) == {wid: "n1"}
    _finish(server, [wid])


@pytest.mark.parametrize(("constraints", "sentence"), [
    (["zone=c"], "No node carries the labels zone=c, so this work would never start; the pool's nodes "
                 f"have {CONTAINERS_LABEL}=crun 1.8.1, zone=a, zone=b"),
    (["gpu-kind"], "No node carries the labels gpu-kind"),
    (["zone=b", "rack"], "No node carries the labels rack, zone=b"),
    (["bad key"], "constraint 'bad key' is not KEY or KEY=VALUE"),
])
def test_a_constraint_no_node_meets_is_refused_at_submit(pool: tuple[Server, str], constraints: list[str],
                                                        sentence: str) -> None:
    server, token = pool
    answer = _submit(server, token, constraints=constraints)
    assert answer.status_code == 422 and sentence in answer.json()["message"], answer.text


@pytest.mark.parametrize("spec", [{"constraints": ["zone=b"]}, {"image": "tiny"}])
def test_work_the_labelled_nodes_could_never_hold_is_refused_at_submit(pool: tuple[Server, str],
                                                                        spec: dict[str, Any]) -> None:
    server, token = pool
    answer = _submit(server, token, resources={"gpus": 6}, **spec)  # n0 has 8 devices, n1 has 4
    assert answer.status_code == 422, answer.text
    assert "Only 1 node(s) carry the labels" in answer.json()["message"]
    assert "cannot hold it: No node has 6 devices" in answer.json()["message"]


def test_work_whose_labelled_nodes_are_full_waits_saying_the_constraint_narrows_it(
        pool: tuple[Server, str]) -> None:
    server, token = pool
    first = _submit(server, token, constraints=["zone=b"], resources={"gpus": 4}).json()["id"]
    assert _launched_nodes(server, [first]) == {first: "n1"}
    late = _submit(server, token, constraints=["zone=b"], resources={"gpus": 1}).json()["id"]

    def waiting() -> bool:
        shown = server.client.get(f"{API}/workloads/{late}", headers=server.headers(token)).json()
        return "its constraint zone=b narrows the choice to 1 of 2 node(s)" in shown["message"]

    server.wait_for(waiting)  # n0 has 4 free devices, but in zone a
    assert server.status(late) == "pending"
    _finish(server, [first])
    assert _launched_nodes(server, [late]) == {late: "n1"}
    _finish(server, [late])


def test_an_image_in_use_cannot_be_removed(pool: tuple[Server, str]) -> None:
    server, token = pool
    answer = server.client.post(f"{API}/images", params={"name": "busy"}, content=_archive(),
                                headers=server.headers())
    assert answer.status_code == 201, answer.text
    wid = _submit(server, token, image="busy", resources={"gpus": 1}).json()["id"]
    refused = server.client.delete(f"{API}/images/busy", headers=server.headers())
    assert refused.status_code == 409, refused.text
    assert f"Image 'busy' is in use by pending or running work ({wid})" in refused.json()["message"]
    _launched_nodes(server, [wid])
    assert server.client.delete(f"{API}/images/busy", headers=server.headers()).status_code == 409
    _finish(server, [wid])
    assert server.client.delete(f"{API}/images/busy", headers=server.headers()).status_code == 200


def test_node_show_lists_the_labels_a_constraint_matches(pool: tuple[Server, str]) -> None:
    server, _ = pool
    shown = server.client.get(f"{API}/nodes/n1", headers=server.headers()).json()
    assert shown["labels"] == {CONTAINERS_LABEL: "crun 1.8.1", "zone": "b"}


def test_a_tenant_cannot_steer_image_work_onto_a_node_without_containers(pool: tuple[Server, str]) -> None:
    server, token = pool
    # zone=a is n0's alone, and n0 cannot run containers: the implied label still holds.
    answer = _submit(server, token, image="tiny", constraints=["zone=a"], resources={"gpus": 1})
    assert answer.status_code == 422, answer.text
    assert f"No node carries the labels {CONTAINERS_LABEL}, zone=a" in answer.json()["message"]
    # Naming the containers label with another value does not drop the implied one either.
    answer = _submit(server, token, image="tiny", constraints=[f"{CONTAINERS_LABEL}=none"])
    assert answer.status_code == 422, answer.text
    assert server.client.get(f"{API}/workloads", params={"status": "pending"},
                             headers=server.headers(token)).json()["items"] == []


def test_the_cli_takes_repeated_constraints() -> None:
    spec = parse(["--constraint", "zone=b", "-C", "rack", "--", "true"])
    assert spec["constraints"] == ["zone=b", "rack"]


def test_a_spec_file_carries_constraints(tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("command: [python, train.py]\nconstraints: [zone=b, rack]\n")
    assert parse(["-f", str(spec_file)])["constraints"] == ["zone=b", "rack"]


def test_the_sdk_sends_constraints_as_the_spec_field() -> None:
    from gpupool.api.workloads import WorkloadSpec
    from gpupool.client import spec_body

    body = spec_body(None, {"command": ["true"], "constraints": ["zone=b", "rack", "zone=b"]})
    assert WorkloadSpec.model_validate(body).constraints == ["rack", "zone=b"]  # stored sorted, once each


def test_the_image_in_use_query_reads_the_spec_on_both_stores(db_url: str, tmp_path: Path) -> None:
    from gpupool.server.services.image_use import users

    crun = replace(node("n0", devices=1, model="H100"), labels={CONTAINERS_LABEL: "crun 1.8.1"})
    server = start_server(tmp_path / "data", url=db_url, provider=ManualProvider([crun]))
    try:
        server.rt.settings = dataclasses.replace(server.rt.settings, image_dir=tmp_path / "images")
        for name in ("tiny", "tiny2"):
            answer = server.client.post(f"{API}/images", params={"name": name}, content=_archive(),
                                        headers=server.headers())
            assert answer.status_code == 201, answer.text
        ids = [_submit(server, server.admin_token, image="tiny", resources={"gpus": 1}).json()["id"]
               for _ in range(2)]
        other = _submit(server, server.admin_token, image="tiny2").json()["id"]
        with server.rt.store.read() as session:
            assert users(session, "tiny") == sorted(ids)  # pending or running alike
            assert users(session, "tiny2") == [other]
            assert users(session, "tin") == []
    finally:
        stop_server(server)


def test_the_cli_refuses_a_malformed_constraint_before_it_calls_the_server() -> None:
    from gpupool.cli.submit_fast import UsageError

    with pytest.raises(UsageError, match=r"Option --constraint got 'bad key', which is not KEY or KEY=VALUE"):
        parse(["--constraint", "bad key", "--", "true"])
