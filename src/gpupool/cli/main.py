"""The `gpupool` command: registers each noun's sub-app lazily so start-up stays fast."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer

# name -> (module, attribute, help). Each module exposes a typer app; it is imported only when used.
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "profiles": ("gpupool.cli.profiles", "app", "List the device profiles gpupool knows."),
    "sim": ("gpupool.cli.sim", "app", "Replay cluster traces through the scheduler (fill, replay)."),
}

# Top-level commands (not groups): name -> (module, function, help).
COMMANDS: dict[str, tuple[str, str, str]] = {}


class LazyGroup(typer.core.TyperGroup):
    """A click group that imports a sub-command's module only when that command runs."""

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(SUBCOMMANDS) | set(COMMANDS))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in SUBCOMMANDS:
            module, attr, _ = SUBCOMMANDS[cmd_name]
            sub = getattr(importlib.import_module(module), attr)
            command = typer.main.get_command(sub)
            command.help = command.help or SUBCOMMANDS[cmd_name][2]
            return command
        if cmd_name in COMMANDS:
            module, attr, _ = COMMANDS[cmd_name]
            func = getattr(importlib.import_module(module), attr)
            single = typer.Typer()
            single.command(name=cmd_name)(func)
            return typer.main.get_command(single)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, SUBCOMMANDS[name][2]) for name in sorted(SUBCOMMANDS)]
        rows += [(name, COMMANDS[name][2]) for name in sorted(COMMANDS)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    cls=LazyGroup,
    help="gpupool: pool the accelerators of many servers and schedule AI work onto slices of them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """gpupool: pool the accelerators of many servers and schedule AI work onto slices of them."""


def main() -> None:
    """Entry point: run the CLI, turning gpupool errors into one sentence and an exit code."""
    from gpupool.errors import GpupoolError

    try:
        app(standalone_mode=True)
    except GpupoolError as exc:  # pragma: no cover - commands report their own errors
        print(f"Error: {exc.message}", file=sys.stderr)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
