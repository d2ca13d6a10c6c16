"""The typer application behind `gpupool`: sub-commands are imported only when they run.

Kept apart from cli/main.py so that the hot path (`gpupool submit`) never imports typer. Here too:
usage errors become one sentence (cli/_usage.py), help shows no type tags (cli/_help.py), and the
other spelling of a group's name (`nodes` for `node`) is accepted.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import typer

from gpupool.cli import _help
from gpupool.cli._usage import is_a, usage_sentence
from gpupool.cli.main import ALIASES, COMMANDS, SUBCOMMANDS

_help.install()
EXTRA_OF_MODULE: dict[str, str] = {
    **dict.fromkeys(("fastapi", "fastapi_offline", "starlette", "uvicorn", "sqlalchemy", "alembic", "psycopg",
                     "prometheus_client", "pynvml", "numpy", "scipy", "networkx", "matplotlib",
                     "cryptography", "limits"), "server"),
    "ray": "ray",
}
"""The top-level modules of each extra (pyproject.toml): a command that needs one names the extra."""
_COMPLETION_PARAMS = {"install_completion", "show_completion"}  # one `gpupool completion` instead
COMPLETE_VAR = "_GPUPOOL_COMPLETE"


class _LazyCommand(typer.core.TyperCommand):
    """Stands in for a command in help listings; imports the real one only when it runs."""

    def __init__(self, name: str, help_text: str, load: Any) -> None:
        super().__init__(name=name, help=help_text, short_help=help_text)
        self._load = load

    def make_context(self, info_name: Any, args: Any, parent: Any = None, **extra: Any) -> Any:
        return self._load().make_context(info_name, args, parent=parent, **extra)


def _without_completion(command: Any) -> Any:
    command.params = [p for p in command.params if p.name not in _COMPLETION_PARAMS]
    return command


def _load_group(name: str) -> Any:
    module, attr, help_text = SUBCOMMANDS[name]
    command = _without_completion(typer.main.get_command(getattr(importlib.import_module(module), attr)))
    command.help = command.help or help_text
    return _help.reflow_tree(command)


def _load_single(name: str) -> Any:
    module, attr, _ = COMMANDS[name]
    single = typer.Typer(add_completion=False)
    single.command(name=name)(getattr(importlib.import_module(module), attr))
    return _help.reflow_tree(typer.main.get_command(single))


class LazyGroup(typer.core.TyperGroup):
    """A group whose sub-commands are imported only when they run, so start-up stays fast."""

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(SUBCOMMANDS) | set(COMMANDS))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd_name = ALIASES.get(cmd_name, cmd_name)
        if cmd_name in SUBCOMMANDS:
            return _LazyCommand(cmd_name, SUBCOMMANDS[cmd_name][2], lambda: _load_group(cmd_name))
        if cmd_name in COMMANDS:
            return _LazyCommand(cmd_name, COMMANDS[cmd_name][2], lambda: _load_single(cmd_name))
        return super().get_command(ctx, cmd_name)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Run; in standalone mode a usage error is one line on stderr and exit code 2."""
        if len(args) < 2:
            kwargs["prog_name"] = kwargs.get("prog_name") or "gpupool"
        if os.environ.get(COMPLETE_VAR):  # the shell asks for completions (`gpupool completion`)
            from typer.completion import completion_init

            completion_init()
        standalone = kwargs.pop("standalone_mode", True)
        kwargs["standalone_mode"] = False
        if not standalone:
            return super().main(*args, **kwargs)
        try:
            result = super().main(*args, **kwargs)
        except Exception as exc:
            _exit_for(exc)
        sys.exit(result if isinstance(result, int) and not isinstance(result, bool) else 0)


def _exit_for(exc: Any) -> None:
    """Print a usage error, or a missing extra, as one sentence and exit with its code; re-raise
    anything else."""
    extra = EXTRA_OF_MODULE.get((exc.name or "").partition(".")[0]) if isinstance(exc, ImportError) else None
    if extra:
        print(f"Error: `{_command_words()}` needs gpupool's {extra} extra ({exc}); install it with "
              f"pip install 'gpupool[{extra}]'.", file=sys.stderr)
        sys.exit(2)
    if is_a(exc, "Abort"):
        print("Aborted.", file=sys.stderr)
        sys.exit(1)
    if not is_a(exc, "ClickException"):
        raise exc
    if not is_a(exc, "NoArgsIsHelpError"):
        print(f"Error: {usage_sentence(exc)}", file=sys.stderr)
    elif exc.format_message().strip():  # with rich, the help is already printed
        print(exc.format_message(), file=sys.stderr)
    sys.exit(exc.exit_code)


def _command_words() -> str:
    """The command being run, as typed: `gpupool up`, `gpupool sim fill`."""
    words = ["gpupool"]
    for arg in sys.argv[1:3]:
        if arg.startswith("-") or (len(words) == 2 and words[1] in COMMANDS):
            break
        words.append(arg)
    return " ".join(words)


app = typer.Typer(
    cls=LazyGroup,
    help="gpupool: pool the accelerators of many servers and schedule AI work onto slices of them.\n\n"
    "Example: gpupool submit --gpus 1 -- python train.py\n\n"
    "Exit codes: 0 ok, 1 the workload failed (or `wait` timed out), 2 bad usage, "
    "3 not found or forbidden, 4 server unreachable.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root() -> None:
    """gpupool: pool the accelerators of many servers and schedule AI work onto slices of them."""
