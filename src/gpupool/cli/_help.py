"""Plain help text: option values shown as NAME rather than typer's type tags (`<list[str]>`).

Typer prints every option's Python type beside it (`--seed <int>`, `--help <bool>`) and has no
setting to turn that off, so the two display hooks are replaced here, once, for the whole CLI:
flags show nothing, options show their name (`--seed SEED`), arguments show their name in capitals
(`queue create TENANT NAME`). Only how help looks changes; parsing and conversion do not.

A docstring's paragraphs are also reflowed (`reflow`): typer keeps each source line's break, so at
80 columns every wrapped source line left a short line behind it.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperOption


def option_value_name(param: Any) -> str:
    """NAME for `--name`, GPU_MEMORY for `--gpu-memory`: what help shows after an option."""
    longest = max(param.opts, key=len) if param.opts else str(param.name)
    return longest.lstrip("-").upper().replace("-", "_")


def _option_type(self: Any, ctx: Any) -> str | None:
    if self.metavar is not None:
        return str(self.metavar)
    if self.is_flag or self.count:
        return None
    descriptor = getattr(self, "type_descriptor", None)
    if descriptor is not None and descriptor.is_choice and self.show_choices:
        return "|".join(str(getattr(choice, "value", choice)) for choice in descriptor.choices or ())
    return option_value_name(self)


def _argument_type(self: Any, ctx: Any) -> str | None:
    return None


def _argument_name(self: Any) -> str:
    return str(self.metavar) if self.metavar is not None else str(self.name).upper()


def _argument_usage(self: Any) -> str:
    name = _argument_name(self)
    name = name if self.required else f"[{name}]"
    return name + ("..." if self.nargs != 1 else "")


def install() -> None:
    """Replace typer's type tags in help (idempotent; a typer without these hooks is left as is)."""
    if hasattr(TyperOption, "display_type_rich"):
        setattr(TyperOption, "display_type_rich", _option_type)  # noqa: B010
    if hasattr(TyperArgument, "display_type_rich"):
        setattr(TyperArgument, "display_type_rich", _argument_type)  # noqa: B010
    if hasattr(TyperArgument, "display_name_raw"):
        setattr(TyperArgument, "display_name_raw", property(_argument_name))  # noqa: B010
    if hasattr(TyperArgument, "_usage_display_name"):
        setattr(TyperArgument, "_usage_display_name", _argument_usage)  # noqa: B010


def reflow(text: str | None) -> str | None:
    """`text` with each paragraph's lines joined into one (the terminal wraps it); blank lines, and
    lines that start indented, as a list item (-, *, |) or as an example (`Example:`), keep their
    breaks."""
    if not text:
        return text
    lines: list[str] = []
    for line in text.split("\n"):
        joins = (lines and lines[-1].strip() and line.strip()
                 and not line.startswith((" ", "\t", "- ", "* ", "|", "Example:", "Examples:")))
        if joins:
            lines[-1] = f"{lines[-1].rstrip()} {line.strip()}"
        else:
            lines.append(line)
    return "\n".join(lines)


def reflow_tree(command: Any) -> Any:
    """Reflow the help of `command` and of every sub-command under it (click commands and groups)."""
    command.help = reflow(command.help)
    for sub in (getattr(command, "commands", None) or {}).values():
        reflow_tree(sub)
    return command
