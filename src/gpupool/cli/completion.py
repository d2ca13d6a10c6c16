"""`gpupool completion`: print the shell completion script (one command instead of options everywhere)."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

SHELLS = ("bash", "zsh", "fish", "powershell")


def completion(
    shell: Annotated[
        str, typer.Argument(help="bash, zsh, fish or powershell (default: the login shell, $SHELL).")
    ] = "",
) -> None:
    """Print the completion script for a shell; load it from the shell's start-up file.

    Example: echo 'eval "$(gpupool completion bash)"' >> ~/.bashrc
    """
    from typer._completion_shared import get_completion_script

    from gpupool.errors import did_you_mean

    chosen = (shell or os.path.basename(os.environ.get("SHELL", "")) or "bash").lower()
    if chosen == "pwsh":
        chosen = "powershell"
    if chosen not in SHELLS:
        print(f"Error: no completion for shell {chosen!r}; choose one of {', '.join(SHELLS)}."
              + did_you_mean(chosen, list(SHELLS)), file=sys.stderr)
        raise typer.Exit(2)
    from gpupool.cli.lazy import COMPLETE_VAR

    typer.echo(get_completion_script(prog_name="gpupool", complete_var=COMPLETE_VAR, shell=chosen))
