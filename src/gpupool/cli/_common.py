"""Shared pieces of the control-plane CLI verbs: the client, error-to-exit-code, tables."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer

from gpupool.errors import GpupoolError, InvalidInput

F = TypeVar("F", bound=Callable[..., Any])

EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 the workload failed (or wait timed out), 2 bad usage, "
    "3 not found or forbidden, 4 server unreachable."
)
SIMULATED_MARK = "(sim)"
PLOT_FORMATS = ("png", "svg", "pdf", "eps", "jpg", "jpeg")
"""What a plot or drawing (matplotlib) is written as, chosen by the file name's suffix."""


def default_policy() -> str:
    """The placement policy `gpupool up` runs when neither --policy nor the configuration names one
    (the configuration's default): also `sim fill`'s and `sim replay`'s."""
    return str(config_default("placement"))


def config_default(setting: str) -> Any:
    """The configuration's default of `scheduling.<setting>` (`PoolConfig()`, what `gpupool up` runs
    without --config): the one place the CLI's help reads a scheduling default from."""
    from gpupool.config import PoolConfig

    return getattr(PoolConfig().scheduling, setting)


def config_default_text(setting: str) -> str:
    """'default: the configuration's scheduling.ordering, drf' (a switch's value as on / off)."""
    value = config_default(setting)
    shown = ("on" if value else "off") if isinstance(value, bool) else str(value)
    return f"default: the configuration's scheduling.{setting}, {shown}"


def policy_names_text() -> str:
    """The registered placement policies, for help text ("best-fit, fgd, ...")."""
    from gpupool.core.scheduling.policies.base import policy_names

    return ", ".join(policy_names())


def check_policy(name: str) -> str:
    """`name` when it is a registered placement policy, else UnknownName with a did-you-mean."""
    from gpupool.core.scheduling.policies.base import policy_class

    policy_class(name)
    return name


def directory(flag: str) -> Callable[[str], Path]:
    """The parser of a directory option: an empty (or blank) value is refused with a sentence rather
    than taken for the current directory, which is what Path("") is."""

    def parse(value: str) -> Path:
        if not value.strip():
            raise typer.BadParameter(f"{flag} is empty; give a directory, or leave {flag} out for its "
                                     "default.")
        return Path(value)

    return parse


def check_plot_path(path: Path | None, flag: str) -> None:
    """Refuse, before any work, a plot file whose name ends in a suffix no plot is written as (a name
    without one is a PNG): matplotlib would raise only once the run is over."""
    if path is None or not path.suffix or path.suffix.lower().removeprefix(".") in PLOT_FORMATS:
        return
    formats = ", ".join(f".{name}" for name in PLOT_FORMATS[:-1]) + f" or .{PLOT_FORMATS[-1]}"
    raise InvalidInput(f"{flag} {str(path)!r} ends in {path.suffix}, not a format a plot can be written in; "
                       f"end the name in {formats}.")


def client(**options: Any) -> Any:
    """A Client of the configured pool; `options` are its keyword arguments (timeout_s, ...)."""
    from gpupool.client import Client

    return Client(**options)


def reports_errors(func: F) -> F:
    """Turn gpupool errors into one sentence on stderr and the documented exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except GpupoolError as exc:
            print(f"Error: {error_text(exc)}", file=sys.stderr)
            raise typer.Exit(exc.exit_code) from None
        except TimeoutError as exc:
            print(f"Error: {exc}", file=sys.stderr)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def flags_for_fields(**flags: str) -> Callable[[F], F]:
    """For a command whose options are sent as request fields, under @reports_errors: the server's
    sentence about a field names the option the user typed instead (`Field 'since_s' must be >= 0`
    is said `--since must be >= 0`), as `gpupool submit` does. `flags` maps each field to its option."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            except GpupoolError as exc:
                exc.message = in_flag_terms(exc.message, flags)
                raise

        return wrapper  # type: ignore[return-value]

    return decorate


def in_flag_terms(message: str, flags: dict[str, str]) -> str:
    """`message` with each field of `flags` it names (Field 'quota_gpus' ...) said as its option."""
    from gpupool.cli.submit_fast import in_flag_terms as named

    return named(message, flags)


@contextmanager
def reports_run_errors() -> Iterator[None]:
    """For the `gpupool sim` commands, which read inputs and write their JSON, plots and tables:
    a gpupool error becomes its sentence and exit code, a file that cannot be written (or read)
    one sentence and exit 2 (bad usage: the path is the caller's), never a traceback."""
    try:
        yield
    except GpupoolError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)  # kept whole: some list every bad line
        raise typer.Exit(exc.exit_code) from None
    except OSError as exc:
        where = f" ({exc.strerror}: {exc.filename})" if exc.filename and exc.strerror else f" ({exc})"
        print(f"Error: cannot write output{where}. Choose a path in a writable directory.", file=sys.stderr)
        raise typer.Exit(2) from None


def hand_down(ctx: typer.Context, **options: Any) -> None:
    """For a group's callback: options given to the group before its sub-command (`gpupool node -o json
    ls`) become that sub-command's defaults, as if given after it; one the sub-command does not take is
    refused (exit 2), never silently ignored. Nothing to do when no sub-command follows."""
    sub = ctx.invoked_subcommand
    given = [name for name in options if _given(ctx, name)]
    if sub is None or not given:
        return
    group = ctx.command
    assert isinstance(group, typer.core.TyperGroup)
    command = group.get_command(ctx, sub)
    takes = {param.name for param in command.params} if command is not None else set()
    for name in given:
        if name not in takes:
            flag = max(next(p.opts for p in group.params if p.name == name), key=len)
            print(f"Error: `{ctx.command_path} {sub}` takes no {flag}; drop it.", file=sys.stderr)
            raise typer.Exit(2)
    ctx.default_map = {**(ctx.default_map or {}), sub: {name: options[name] for name in given}}


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option `name` was given on the command line (or by its environment variable)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def error_text(exc: GpupoolError) -> str:
    """The sentence for a gpupool error; an authentication error also says where the token came from."""
    message = exc.message
    if exc.code == "unauthorized":
        from gpupool.clientconfig import with_token_source

        message = with_token_source(message)
    from gpupool.cli._usage import sentence

    return sentence(message)  # one line, one full stop


def console() -> Any:
    """A rich Console: the terminal's width on a terminal, unbounded when piped (tables are never
    cut or wrapped in a file or a pipe)."""
    from gpupool.cli.output import console as sized

    return sized()


def gpus_text(gpus: float) -> str:
    return f"{gpus:g}"


def ago(seconds: float | None, now: float) -> str:
    if seconds is None:
        return "-"
    delta = max(0.0, now - seconds)
    if delta < 120:
        return f"{delta:.0f}s ago"
    if delta < 7200:
        return f"{delta / 60:.0f}m ago"
    return f"{delta / 3600:.1f}h ago"
