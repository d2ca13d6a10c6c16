"""Option and argument errors as one sentence (`--quota must be >= 0 (got -2).`), not a box.

Typer parses with click; click's errors carry the context, the parameter and (for a value that
failed conversion) the pydantic error with the offending input, which is all a sentence needs.
Classes are told apart by name so this works with typer's vendored click and with click itself.
"""

from __future__ import annotations

import re
from typing import Any

from gpupool.errors import closest

_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
           "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}


def is_a(exc: BaseException, class_name: str) -> bool:
    """Whether `exc` is (a subclass of) a class called `class_name` (click's or typer's)."""
    return any(cls.__name__ == class_name for cls in type(exc).__mro__)


def sentence(text: str) -> str:
    """One line ending in exactly one full stop (or the question mark it already has)."""
    text = " ".join(text.split()).rstrip()
    while text.endswith(".."):
        text = text[:-1]
    return text if text.endswith((".", "?", "!")) else text + "."


def usage_sentence(exc: Any) -> str:
    """The one-sentence message for a click usage error (without the 'Error: ' prefix)."""
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else "gpupool"
    if is_a(exc, "NoSuchOption"):
        negative = _negative_argument(exc.option_name, ctx)
        if negative:
            return negative
        close = closest(exc.option_name, _option_names(ctx))
        hint = f"did you mean {close}?" if close else f"see {path} --help."
        return f"{path} has no option {exc.option_name}; {hint}"
    if is_a(exc, "MissingParameter"):
        return sentence(f"{path} needs {_hint(exc)}; see {path} --help")
    if is_a(exc, "BadParameter"):
        return sentence(_bad_value(exc))
    if is_a(exc, "BadOptionUsage") and "requires" in exc.message:
        return f"{exc.option_name} needs a value."
    message = str(getattr(exc, "message", exc))
    if message.startswith("No such command") and ctx is not None:
        name = message.split("'")[1] if message.count("'") >= 2 else ""
        names = [n for n in ctx.command.list_commands(ctx) if not n.startswith("_")]
        close = closest(name, names)
        hint = f"did you mean {close!r}?" if close else f"see {path} --help."
        return f"{path} has no command {name!r}; {hint}"
    return sentence(f"{message.rstrip('.')}; see {path} --help")


def _negative_argument(name: str, ctx: Any) -> str:
    """For a negative number click read as an option (`service scale web -1`; -1 for -1.5 too): the
    sentence of the command's numeric argument that has a minimum ('' when there is none)."""
    try:
        float(name)
    except ValueError:
        return ""
    if ctx is None:
        return ""
    for param in ctx.command.get_params(ctx):
        least = getattr(param, "min", None)  # typer keeps an argument's bound on the parameter
        if getattr(param, "param_type_name", "") == "argument" and least is not None and float(name) < least:
            which = str(param.metavar or param.name).upper()
            return f"{which} must be {least} or more, not a negative number."
    return ""


def _option_names(ctx: Any) -> list[str]:
    if ctx is None:
        return []
    names: list[str] = []
    for param in ctx.command.get_params(ctx):
        if not getattr(param, "hidden", False):
            names += [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--")]
    return names


def _hint(exc: Any) -> str:
    """How the user wrote (or would write) the parameter: --quota, or TENANT for an argument."""
    param = getattr(exc, "param", None)
    if param is None:
        hint = getattr(exc, "param_hint", None)
        return " / ".join(hint) if isinstance(hint, list | tuple) else str(hint or "a value")
    if getattr(param, "param_type_name", "") == "argument":
        return str(param.metavar or param.name).upper()
    return str(max(param.opts, key=len))


def _bad_value(exc: Any) -> str:
    """`--quota must be >= 0 (got -2)` from the pydantic error behind a failed conversion."""
    cause = exc.__cause__
    errors = cause.errors() if cause is not None and hasattr(cause, "errors") else []
    if getattr(exc, "param", None) is None and not getattr(exc, "param_hint", None):
        return str(exc.message)  # raised by a command with its own sentence
    hint = _hint(exc)
    if not errors:  # a sentence of its own that names the option already is kept as it is
        return str(exc.message) if str(exc.message).startswith(f"{hint} ") else f"{hint}: {exc.message}"
    error = errors[0]
    kind, got, limits = str(error.get("type", "")), _shown(error.get("input")), error.get("ctx") or {}
    choices = _choices(str(error.get("msg", "")))
    if choices:  # a value outside a fixed list (-o, an enum): the list, and the one meant
        close = closest(str(error.get("input")), choices)
        meant = f"; did you mean {close}?" if close else ""
        return f"{hint} must be {_one_of(choices)} (got {got}){meant}"
    if kind in _BOUNDS:
        symbol, key = _BOUNDS[kind]
        return f"{hint} must be {symbol} {_number(limits.get(key))} (got {got})"
    if kind.startswith("int_"):
        return f"{hint} takes a whole number (got {got})"
    if kind.startswith("float_"):
        return f"{hint} takes a number such as 2 or 0.25 (got {got})"
    if kind.startswith("bool_"):
        return f"{hint} takes true or false (got {got})"
    if kind in ("enum", "literal_error"):
        return f"{hint} must be {limits.get('expected', 'one of the listed values')} (got {got})"
    text = str(error.get("msg", "is not valid")).removeprefix("Value error, ")
    return f"{hint}: {text[:1].lower()}{text[1:].rstrip('.')} (got {got})"


_NOT_ONE_OF = re.compile(r"is not one of ((?:'[^']*'(?:, )?)+)\.?$")


def _choices(message: str) -> list[str]:
    """The values a choice takes, from its "'x' is not one of 'a', 'b'." message ([] for others)."""
    match = _NOT_ONE_OF.search(message)
    return re.findall(r"'([^']*)'", match.group(1)) if match else []


def _one_of(choices: list[str]) -> str:
    """'table, wide, json or name'."""
    return choices[0] if len(choices) == 1 else f"{', '.join(choices[:-1])} or {choices[-1]}"


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _shown(value: object) -> str:
    text = str(value)
    return text if text and not any(ch.isspace() for ch in text) else repr(text)
