"""Pydantic's validation errors in plain English: one sentence naming every problem, no regexes.

`Field 'priority' must be a whole number (got 'high').` for one problem; for several, one sentence
that lists them all, so a spec file with three mistakes is fixed in one round, not three.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpupool.api.common import PATTERN_RULES

_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
           "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}
_KINDS = {"int": "a whole number", "float": "a number", "bool": "true or false", "string": "text",
          "list": "a list", "dict": "a mapping", "model": "a mapping", "tuple": "a list"}
_MANIFEST_KEYS = {"apiVersion", "kind", "metadata", "spec"}


def location(loc: Iterable[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


def problem(error: Mapping[str, Any]) -> str:
    """What is wrong with one field, without the field's name: `must be >= 1 (got -1)`."""
    kind = str(error.get("type", ""))
    limits = error.get("ctx") or {}
    got = _shown(error.get("input"))
    if kind == "extra_forbidden":
        return "is not a known field"
    if kind == "missing":
        return "is required"
    if kind == "json_invalid":
        return "is not valid JSON"
    if kind == "string_pattern_mismatch":
        rule = PATTERN_RULES.get(str(limits.get("pattern", "")), "has characters that are not allowed")
        return f"is {got}, but {rule}"
    if kind in _BOUNDS:
        symbol, key = _BOUNDS[kind]
        return f"must be {symbol} {_number(limits.get(key))} (got {got})"
    if kind in ("string_too_long", "too_long"):
        return f"is too long (at most {limits.get('max_length')})"
    if kind in ("string_too_short", "too_short"):
        least = limits.get("min_length")
        return "must not be empty" if least == 1 else f"is too short (at least {least})"
    base = kind.split("_", 1)[0]
    if base in _KINDS and kind.endswith(("_type", "_parsing", "_from_float", "_fraction")):
        return f"must be {_KINDS[base]} (got {got})"
    text = str(error.get("msg", "is not valid")).removeprefix("Value error, ").rstrip(".")
    return text[:1].lower() + text[1:]


def message(errors: list[dict[str, Any]]) -> tuple[str, list[dict[str, str]]]:
    """The one sentence for a list of pydantic errors, and the problems for the details."""
    problems = [{"field": location(e.get("loc", ())), "problem": problem(e), "type": str(e.get("type"))}
                for e in errors] or [{"field": "body", "problem": "is not valid", "type": ""}]
    problems.sort(key=lambda p: p["type"] != "extra_forbidden")  # a stray field first: it explains the rest
    phrases = [_phrase(p) for p in problems]
    if len(phrases) == 1:
        text = phrases[0]
        if text.split(" ", 1)[0].isalpha():  # a word, not a name a rule begins with (min_replicas, --mount)
            text = text[:1].upper() + text[1:]
    else:
        text = f"{len(phrases)} problems: " + "; ".join(phrases)
    unknown = {p["field"] for p in problems if p["type"] == "extra_forbidden"}
    if unknown & _MANIFEST_KEYS:
        text += (" (a gpupool spec is not a Kubernetes manifest: give name, command and resources at "
                 "the top level)")
    elif unknown:
        text += " (remove it or check its spelling)" if len(unknown) == 1 else " (remove or correct them)"
    return text.rstrip(".") + ".", [{"field": p["field"], "problem": p["problem"]} for p in problems]


def _phrase(item: Mapping[str, str]) -> str:
    if item["type"] == "extra_forbidden":
        return f"unknown field {item['field']!r}"
    if item["type"] == "json_invalid":
        return "the request body is not valid JSON"
    if item["field"] == "body":  # no field of it: the body as a whole, which the sender never named so
        if item["type"] == "value_error":
            return item["problem"]  # a rule across fields (a model's own check): its sentence names them
        return f"the request body {item['problem']}"
    return f"field {item['field']!r} {item['problem']}"


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _shown(value: object) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."
