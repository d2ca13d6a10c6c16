"""Shared pieces of the API schemas: the strict base model, name rules and the error body."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
NAME_RULE = ("a name may hold lower-case letters, digits and '-', and starts and ends with a letter or "
             "digit")

PATTERN_RULES: dict[str, str] = {
    NAME_PATTERN: NAME_RULE,
    r"^[A-Za-z0-9._-]*$": "a name may hold ASCII letters, digits, '.', '_' and '-'",
    r"^[A-Za-z_][A-Za-z0-9_]*$": "a variable's name may hold ASCII letters, digits and '_', and does not "
                                 "start with a digit",
    r"^[a-z0-9][a-z0-9._-]{0,62}$": "an image's name holds 1-63 lower-case letters, digits, '.', '_' and "
                                    "'-', and starts with a letter or digit",
    r"^[A-Za-z_][A-Za-z0-9._-]*\$?$": "a Unix account name may hold ASCII letters, digits, '.', '_' and '-', "
                                     "and starts with a letter or '_'",
}
"""Each field pattern of the API in words, for error messages (a user should never read a regex)."""
Name = Annotated[
    str,
    Field(min_length=1, max_length=63, pattern=NAME_PATTERN,
          description="lower-case letters, digits and '-', 1-63 characters, starting and ending "
          "with a letter or digit"),
]


_CONTROL_ANY = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_CONTROL_IN_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def refuse_control(value: str, *, text: bool = False, where: str = "") -> str:
    """`value` unchanged, or ValueError naming its first control character. Paths, program names and
    the like may hold none (NUL cannot reach exec or a filesystem call, and the others only disguise
    what a listing shows); with `text` (a command's arguments, an environment value) tab, newline
    and carriage return are allowed, as a shell script passed to `sh -c` needs them. Lone UTF-16
    surrogates are refused too: they cannot be encoded for exec."""
    found = (_CONTROL_IN_TEXT if text else _CONTROL_ANY).search(value)
    if found is None:
        return value
    allowed = " (tab, newline and carriage return are allowed there)" if text else ""
    code = ord(found.group())
    what = "an unpaired surrogate" if 0xD800 <= code <= 0xDFFF else "the control character"
    raise ValueError(f"{where}holds {what} U+{code:04X} at position {found.start()}, which is not "
                     f"allowed{allowed}; remove it")


def _text_without_control(value: str) -> str:
    return refuse_control(value, text=True)


ArgText = Annotated[str, Field(max_length=65536), AfterValidator(_text_without_control)]
"""A command's argument or an environment variable's value: no control character but tab, newline
and carriage return (a script given to `sh -c` needs those)."""


LineText = Annotated[str, AfterValidator(refuse_control)]
"""A one-line free text a person reads (a reason, a note): no control character at all, so it can
disguise nothing in a listing and send no escape sequence to a terminal that prints it."""


class Strict(BaseModel):
    """Every API model refuses fields it does not know, so a typo is an error, not a no-op."""

    model_config = ConfigDict(extra="forbid")


class ErrorBody(Strict):
    """The one shape of every error answer."""

    code: str = Field(description="stable machine-readable code, e.g. not_found, quota_exceeded")
    message: str = Field(description="one sentence: what was wrong and how to fix it")
    details: dict[str, Any] = Field(default_factory=dict)


class Health(Strict):
    status: str
    version: str
    provider: str
    simulated: bool
    database: str
