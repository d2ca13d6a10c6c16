"""A refusal about the request body as a whole never calls it a field: `Field 'body' ...` named
something the sender never wrote. A rule across fields (a model's own check) is its own sentence;
a body that is missing or not an object says so."""

from __future__ import annotations

import pytest

from conftest import Server
from gpupool.server.validation import message

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
