"""The catalogue of reasons is complete: every code the core or the server records has one entry,
every entry is a code some enum declares, and every declared code is produced somewhere in src/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpupool.api.events import EventReason
from gpupool.api.reasons import CATALOGUE, describe
from gpupool.core.model import Reason

SRC = Path(__file__).resolve().parents[1] / "src" / "gpupool"
DECLARED = {m.value for m in Reason} | {m.value for m in EventReason}


def test_the_two_enums_never_share_a_code() -> None:
    assert not {m.value for m in Reason} & {m.value for m in EventReason}


def test_every_declared_code_has_one_entry_and_every_entry_is_declared() -> None:
    assert set(CATALOGUE) == DECLARED
    assert all(code == info.code for code, info in CATALOGUE.items())


@pytest.mark.parametrize("code", sorted(DECLARED))
def test_each_entry_is_a_sentence_and_a_hint(code: str) -> None:
    info = describe(code)
    for text in (info.text, info.hint):
        assert text[:1].isupper() or text.startswith("`"), text
        assert text.endswith("."), text
        assert 10 < len(text) <= 200, text
        assert "_" not in code or code not in text, "say it in words, not by repeating the code"


def _sources() -> str:
    """Every module of src/ except the enums' and the catalogue's own, where members are named."""
    skip = {SRC / "core" / "model.py", SRC / "api" / "events.py", SRC / "api" / "reasons.py"}
    return "\n".join(p.read_text() for p in sorted(SRC.rglob("*.py")) if p not in skip)


def test_every_declared_code_is_produced_somewhere() -> None:
    """Unused reason codes go: each member is named as Reason.X / EventReason.X outside its enum."""
    text = _sources()
    used_core = set(re.findall(r"(?<!Event)Reason\.([A-Z_]+)\b", text))
    used_event = set(re.findall(r"EventReason\.([A-Z_]+)\b", text))
    assert {m.name for m in Reason} - used_core == set(), "core reasons nobody produces"
    assert {m.name for m in EventReason} - used_event == set(), "event reasons nobody produces"


def test_final_codes_are_the_ones_after_which_it_never_runs() -> None:
    final = {code for code, info in CATALOGUE.items() if info.final}
    assert final == {
        Reason.NEVER_FITS, Reason.UNKNOWN_PRIORITY_CLASS, Reason.UNKNOWN_QUEUE,
        EventReason.COMPLETED, EventReason.POD_FAILED, EventReason.POD_LOST, EventReason.LOST_ON_RESTART,
        EventReason.LAUNCH_FAILED, EventReason.CANCELLED_BY_USER, EventReason.TIME_LIMIT,
        EventReason.DEPENDENCY_NEVER_SATISFIED,
    }


def test_a_code_no_enum_knows_reads_as_itself_without_text() -> None:
    """Rows an older version wrote (node_gone, requeued, ...) stay readable."""
    info = describe("node_gone")
    assert (info.code, info.final, info.text, info.hint) == ("node_gone", False, "", "")
    assert describe("").text == ""


def test_the_cli_docs_list_every_reason_as_the_catalogue_says() -> None:
    docs = (SRC.parents[1] / "docs" / "cli.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (?:decision|event) \| ((?:yes|no) \| .*) \|$", docs, re.M))
    assert set(rows) == DECLARED
    for code, info in CATALOGUE.items():
        assert rows[code] == f"{'yes' if info.final else 'no'} | {info.text}", code
