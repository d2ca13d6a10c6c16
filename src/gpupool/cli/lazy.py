"""The typer application behind `gpupool`: sub-commands are imported only when they run.

Kept apart from cli/main.py so that the hot path (`gpupool submit`) never imports typer.
"""

from __future__ import annotations

import importlib
from typing import Any

import typer

from gpupool.cli.main import COMMANDS, SUBCOMMANDS


class _LazyCommand(typer.core.TyperCommand):
    """Stands in for a command in help listings; imports the real one only when it runs."""

    def __init__(self, name: str, help_text: str, load: Any) -> None:
        super().__init__(name=name, help=help_text, short_help=help_text)
        self._load = load

    def make_context(self, info_name: Any, args: Any, parent: Any = None, **extra: Any) -> Any:
        return self._load().make_context(info_name, args, parent=parent, **extra)


def _load_group(name: str) -> Any:
    module, attr, help_text = SUBCOMMANDS[name]
    command = typer.main.get_command(getattr(importlib.import_module(module), attr))
    command.help = command.help or help_text
    return command


def _load_single(name: str) -> Any:
    module, attr, _ = COMMANDS[name]
    single = typer.Typer()
    single.command(name=name)(getattr(importlib.import_module(module), attr))
    return typer.main.get_command(single)


class LazyGroup(typer.core.TyperGroup):
    """A group whose sub-commands are imported only when they run, so start-up stays fast."""

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(SUBCOMMANDS) | set(COMMANDS))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in SUBCOMMANDS:
            return _LazyCommand(cmd_name, SUBCOMMANDS[cmd_name][2], lambda: _load_group(cmd_name))
        if cmd_name in COMMANDS:
            return _LazyCommand(cmd_name, COMMANDS[cmd_name][2], lambda: _load_single(cmd_name))
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    cls=LazyGroup,
    help="gpupool: pool the accelerators of many servers and schedule AI work onto slices of them.\n\n"
    "Exit codes: 0 ok, 1 the workload failed (or `wait` timed out), 2 bad usage, "
    "3 not found or forbidden, 4 server unreachable.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """gpupool: pool the accelerators of many servers and schedule AI work onto slices of them."""
