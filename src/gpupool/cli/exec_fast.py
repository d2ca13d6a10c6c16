"""`gpupool exec ID [--pty] -- CMD`, served without typer (cli/alloc_fast.py does the work)."""

from __future__ import annotations


def run(args: list[str]) -> int:
    from gpupool.cli.alloc_fast import exec_run

    return exec_run(args)
