"""Validation answers in English: every problem in one sentence, rules in words, never a regex; a
server never starts with a placement policy it does not know; client URLs are understood or explained.

A refusal about the request body as a whole never calls it a field: `Field 'body' ...` named something
the sender never wrote. A rule across fields (a model's own check) is its own sentence; a body that is
missing or not an object says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import ManualProvider

from conftest import Server
from factories import node
from gpupool.clientconfig import normalize_url
from gpupool.errors import InvalidInput, UnknownName
from gpupool.server.app import create_app
from gpupool.server.db import Store
from gpupool.server.runtime import Runtime
from gpupool.server.settings import Settings
from gpupool.server.validation import message


def test_several_problems_are_one_sentence_naming_each(server: Server) -> None:
    body = {"name": "Bad Name", "command": "echo", "replicas": -1, "resources": {"gpus": "x"}, "extra": 1}
    answer = server.client.post("/api/v1/workloads", json=body, headers=server.headers())
    message = answer.json()["message"]
    assert answer.status_code == 422 and message.startswith("5 problems: unknown field 'extra'; ")
    for part in ("field 'command' must be a list", "letters, digits, '.', '_' and '-'",
                 "field 'replicas' must be >= 1 (got -1)", "field 'resources.gpus' must be a number"):
        assert part in message
    assert "^" not in message and "\n" not in message and message.count(".") >= 1 and ".." not in message
    assert answer.json()["details"]["errors"][0]["field"] == "extra"


def test_a_tenant_name_rule_is_in_words(server: Server) -> None:
    answer = server.client.post("/api/v1/tenants", json={"name": "Team A"}, headers=server.headers())
    assert answer.status_code == 422
    assert answer.json()["message"] == ("Field 'name' is 'Team A', but a name may hold lower-case letters, "
                                        "digits and '-', and starts and ends with a letter or digit.")


def test_the_server_refuses_an_unknown_placement_policy(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, placement="fgdd")
    rt = Runtime(settings=settings, store=Store.open(settings.resolved_database_url),
                 provider=ManualProvider([node("n0", devices=1, model="H100")]))
    try:
        with pytest.raises(UnknownName, match="Did you mean 'fgd'"):
            create_app(rt)
    finally:
        rt.store.close()


@pytest.mark.parametrize(("given", "base"), [
    ("http://10.0.0.1:8765/api/v1", "http://10.0.0.1:8765"),
    ("https://pool.example/api/v1/", "https://pool.example"),
    ("http://pool.example:8765/", "http://pool.example:8765"),
    ("127.0.0.1:8765", "http://127.0.0.1:8765"),
    ("localhost:8765/api/v1", "http://localhost:8765"),
    ("[::1]:8765", "http://[::1]:8765"),
])
def test_urls_are_understood(given: str, base: str) -> None:
    assert normalize_url(given) == base


@pytest.mark.parametrize("given", ["pool.example:8765", "ftp://pool.example"])
def test_other_urls_are_explained(given: str) -> None:
    with pytest.raises(InvalidInput, match="http://"):
        normalize_url(given, "GPUPOOL_URL")


ROLLOUT = "a rollout with max_surge 0 could never replace a replica"
NOT_A_DICT = "Input should be a valid dictionary"


def test_a_rule_across_fields_is_its_own_sentence() -> None:
    text, problems = message([{"loc": ("body",), "type": "value_error", "msg": f"Value error, {ROLLOUT}"}])
    assert text == "A rollout with max_surge 0 could never replace a replica."
    assert problems == [{"field": "body", "problem": ROLLOUT}]


def test_a_rule_that_begins_with_a_name_keeps_it_as_written() -> None:
    text, _ = message([{"loc": ("body",), "type": "value_error",
                        "msg": "Value error, min_replicas (3) is above max_replicas (2)"}])
    assert text == "min_replicas (3) is above max_replicas (2)."


@pytest.mark.parametrize(("error", "said"), [
    ({"loc": ("body",), "type": "missing", "msg": "Field required"}, "The request body is required."),
    ({"loc": ("body",), "type": "model_attributes_type", "msg": NOT_A_DICT, "input": "x"},
     "The request body must be a mapping (got 'x')."),
    ({"loc": (), "type": "dict_type", "msg": NOT_A_DICT, "input": [1]},
     "The request body must be a mapping (got [1])."),
])
def test_a_body_that_is_missing_or_not_an_object_says_so(error: dict[str, object], said: str) -> None:
    assert message([error])[0] == said


def test_a_field_is_still_named_beside_a_rule_of_the_whole() -> None:
    text, _ = message([
        {"loc": ("body", "replicas"), "type": "greater_than_equal", "ctx": {"ge": 1}, "input": 0},
        {"loc": ("body",), "type": "value_error", "msg": "Value error, images take no mounts"}])
    assert text == "2 problems: field 'replicas' must be >= 1 (got 0); images take no mounts."


def test_the_api_answers_a_rule_of_the_whole_spec_in_its_own_words(shared_server: Server) -> None:
    answer = shared_server.client.post("/api/v1/workloads", headers=shared_server.headers(), json={
        "command": ["true"], "image": "busybox", "mounts": [{"source": "/tmp", "target": "/data"}]})
    assert answer.status_code == 422, answer.text
    said = answer.json()["message"]
    assert said.startswith("--mount and secrets as files (NAME:/run/secrets/F) do not reach into a "), said
    assert "body" not in said


def test_the_api_answers_a_missing_body_in_a_sentence(shared_server: Server) -> None:
    answer = shared_server.client.post("/api/v1/workloads", headers=shared_server.headers())
    assert answer.status_code == 422, answer.text
    assert answer.json()["message"] == "The request body is required."
