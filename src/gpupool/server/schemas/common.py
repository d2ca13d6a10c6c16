"""Shared pieces of the API schemas: the strict base model, name rules and the error body."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
NAME_RULE = ("a name may hold lower-case letters, digits and '-', and starts and ends with a letter or "
             "digit")

PATTERN_RULES: dict[str, str] = {
    NAME_PATTERN: NAME_RULE,
    r"^[A-Za-z0-9._-]*$": "a name may hold letters, digits, '.', '_' and '-'",
    r"^[A-Za-z_][A-Za-z0-9_]*$": "a variable's name may hold letters, digits and '_', and does not start "
                                 "with a digit",
    r"^[A-Za-z_][A-Za-z0-9._-]*\$?$": "a Unix account name may hold letters, digits, '.', '_' and '-', "
                                     "and starts with a letter or '_'",
}
"""Each field pattern of the API in words, for error messages (a user should never read a regex)."""
Name = Annotated[
    str,
    Field(min_length=1, max_length=63, pattern=NAME_PATTERN,
          description="lower-case letters, digits and '-', 1-63 characters, starting and ending "
          "with a letter or digit"),
]


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
