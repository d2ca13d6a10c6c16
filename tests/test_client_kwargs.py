"""Client.submit with keyword arguments: the body it sends, its refusals, and a round trip."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from factories import node
from gpupool.api.workloads import ResourcesSpec, WorkloadSpec
from gpupool.client import Client, spec_body, submit_keywords
from gpupool.errors import InvalidInput
from live import live_server
from server.fakes import ManualProvider


def body(spec: Any = None, **fields: Any) -> dict[str, Any]:
    return spec_body(spec, fields)


def test_keywords_build_the_same_body_as_the_dict_form() -> None:
    sent = body(command=("python", "train.py"), gpus=0.25, gpu_memory="8GiB", cpu="500m", memory="4GiB",
                models=("H100",), replicas=2, priority=5, priority_class="high", queue="research",
                time_limit="2h", env={"SEED": "1"}, name="sweep", max_retries=3)
    assert sent == {
        "command": ["python", "train.py"], "replicas": 2, "priority": 5, "priority_class": "high",
        "queue": "research", "time_limit_s": 7200.0, "env": {"SEED": "1"}, "name": "sweep", "max_retries": 3,
        "resources": {"gpus": 0.25, "gpu_memory": "8GiB", "cpu": "500m", "memory": "4GiB",
                      "models": ["H100"]},
    }
    WorkloadSpec.model_validate(sent)  # what the server reads


@pytest.mark.parametrize(("given", "seconds"), [
    ("90s", 90.0), ("30m", 1800.0), ("1:30:00", 5400.0), ("2-12:00:00", 216000.0), (600, 600.0),
    (timedelta(minutes=5), 300.0),
])
def test_time_limit_takes_what_the_cli_takes_and_seconds(given: object, seconds: float) -> None:
    assert body(command=["x"], time_limit=given)["time_limit_s"] == seconds
    assert body(command=["x"], checkpoint_every=given)["checkpoint_interval_s"] == seconds


def test_keywords_apply_on_top_of_a_mapping_or_a_spec() -> None:
    spec = {"command": ["train"], "resources": {"gpus": 1, "memory": "8GiB"}, "queue": "a"}
    assert body(spec, gpus=0.5, queue="b") == {"command": ["train"], "queue": "b",
                                               "resources": {"gpus": 0.5, "memory": "8GiB"}}
    assert spec == {"command": ["train"], "resources": {"gpus": 1, "memory": "8GiB"}, "queue": "a"}
    typed = WorkloadSpec(command=["train"], resources=ResourcesSpec(gpus=1))
    on_top = body(typed, gpus=0.25, replicas=3)
    assert (on_top["resources"]["gpus"], on_top["replicas"], on_top["command"]) == (0.25, 3, ["train"])
    assert body(spec) == spec  # the dict form is sent as it is
    assert body(command=["x"], gpu_memory=None) == {"command": ["x"]}  # None: the server's default


@pytest.mark.parametrize(("wrong", "suggested"), [
    ("gpu", "gpus"), ("gpu_mem", "gpu_memory"), ("replica", "replicas"), ("timelimit", "time_limit"),
    ("priorty_class", "priority_class"),
])
def test_an_unknown_keyword_names_the_closest(wrong: str, suggested: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        body(command=["x"], **{wrong: 1})
    assert caught.value.message == (f"Client.submit() got an unexpected keyword argument {wrong!r}; "
                                    f"did you mean {suggested!r}?")


def test_refusals_are_one_sentence() -> None:
    with pytest.raises(InvalidInput, match=r"^Client.submit\(\) got an unexpected keyword argument 'zzz'; "
                       r"see help\(Client.submit\)\.$"):
        body(command=["x"], zzz=1)
    with pytest.raises(InvalidInput, match="list of words"):
        body(command="python train.py")
    with pytest.raises(InvalidInput, match="not both"):
        body(command=["x"], time_limit="1h", time_limit_s=60)
    with pytest.raises(InvalidInput, match=r"time_limit takes seconds.*got '10'"):
        body(command=["x"], time_limit="10")  # a bare number in a string: Slurm's minutes or seconds?
    with pytest.raises(InvalidInput, match=r"checkpoint_every or checkpoint_interval_s.*not both"):
        body(command=["x"], checkpoint_every="30m", checkpoint_interval_s=60)
    with pytest.raises(InvalidInput, match=r"checkpoint_every takes seconds.*got 'often'"):
        body(command=["x"], checkpoint_every="often")
    with pytest.raises(InvalidInput, match="needs a spec or keyword arguments"):
        body()


def test_every_spec_field_is_a_keyword() -> None:
    keywords = set(submit_keywords())
    set_by_server = {"array_index", "rendezvous", "serve_port", "service_role", "pair_with", "on_behalf"}
    assert set(WorkloadSpec.model_fields) - set_by_server <= keywords
    assert set(ResourcesSpec.model_fields) <= keywords
    server_set = {name for name, field in WorkloadSpec.model_fields.items()
                  if "not submitted" in (field.description or "")}
    assert {"array_index", "rendezvous"} <= server_set
    assert not server_set & keywords  # set by the server
    assert set(keywords) - set(WorkloadSpec.model_fields) - set(ResourcesSpec.model_fields) == {
        "time_limit", "checkpoint_every"}


def test_submit_with_keywords_against_a_live_server(tmp_path: Path) -> None:
    provider = ManualProvider([node("n0", devices=2, model="H100")], exit_code=0)
    with live_server(tmp_path, provider) as srv, Client(srv.url, srv.admin_token) as pool:
        wid = pool.submit(command=["python", "train.py"], gpus=0.25, gpu_memory="8GiB", replicas=2,
                          priority=7, priority_class="high", time_limit="30m", env={"SEED": "3"},
                          name="kw", max_retries=2)
        done = pool.wait(wid, timeout_s=20, poll_s=0.02)
        assert done.status == "succeeded"
        spec = done.spec
        assert (spec.command, spec.replicas, spec.priority, spec.priority_class, spec.time_limit_s,
                spec.env, spec.name, spec.max_retries) == (
                    ["python", "train.py"], 2, 7, "high", 1800.0, {"SEED": "3"}, "kw", 2)
        assert (spec.resources.gpus, spec.resources.gpu_memory) == (0.25, "8GiB")
        assert sorted(len(p.slices) for p in done.pods) == [1, 1]
        assert pool.workload(pool.submit({"command": ["true"]})).spec.command == ["true"]  # dict form
        with pytest.raises(InvalidInput, match="did you mean 'gpus'"):
            pool.submit(command=["true"], gpu=1)  # type: ignore[call-arg]
