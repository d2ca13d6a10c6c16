"""`gpupool config show|check`: the one configuration the server and the simulator read."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from gpupool.cli._common import reports_errors

app = typer.Typer(help="The pool's configuration (YAML): show, check.\n\n"
                  "Example: gpupool config check pool.yaml", no_args_is_help=True, add_completion=False)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c",
                 help="A YAML configuration file (default: GPUPOOL_CONFIG, else the built-in defaults)."),
]


@app.command()
@reports_errors
def show(
    config: ConfigOption = None,
    server: Annotated[bool, typer.Option(
        "--server", help="The configuration the running pool uses (GPUPOOL_URL; the admin token).")] = False,
) -> None:
    """Print the effective configuration as YAML: the file's values over the defaults.

    Example: gpupool config show --config pool.yaml; gpupool config show --server
    """
    if server:  # a client command: works without the server extra
        import yaml

        from gpupool.cli._common import client

        print(yaml.safe_dump(client().pool_config(), sort_keys=False, default_flow_style=False), end="")
        return
    from gpupool.config import CONFIG_ENV, load_config

    print(load_config(config or os.environ.get(CONFIG_ENV) or None).to_yaml(), end="")


@app.command()
@reports_errors
def check(path: Annotated[Path, typer.Argument(help="The YAML file to check.")]) -> None:
    """Check a configuration file: 'ok' (then a note where two settings meet, saying which wins), or
    one sentence per problem, one a line in the file's line order, naming the field and its line.

    Example: gpupool config check pool.yaml
    """
    import sys

    from gpupool.config import load_config
    from gpupool.errors import InvalidInput

    try:
        config = load_config(path)
    except InvalidInput as exc:
        problems = exc.details.get("problems") or [exc.message]
        for problem in problems:  # one a line, in the file's line order
            print(f"Error: {problem}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    print("ok")
    for note in config.notes():  # settings that meet, and which of them wins
        print(f"note: {note}")
