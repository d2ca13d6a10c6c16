"""`gpupool queue create|ls`: a tenant's queues and their GPU quotas (admin)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool.cli._common import client, console, reports_errors

app = typer.Typer(help="Queues and quotas (admin): create, ls, set-quota.", no_args_is_help=True)


@app.command()
@reports_errors
def create(
    tenant: Annotated[str, typer.Argument(help="The tenant that owns it.")],
    name: Annotated[str, typer.Argument(help="The queue name.")],
    quota_gpus: Annotated[
        float | None, typer.Option("--quota", min=0, help="GPUs its running work may hold.")
    ] = None,
) -> None:
    """Create a queue for a tenant, optionally with a GPU quota."""
    with client() as pool:
        queue = pool.create_queue(tenant, name, quota_gpus)
    print(f"{queue.tenant}/{queue.name}")


@app.command("set-quota")
@reports_errors
def set_quota(
    tenant: Annotated[str, typer.Argument(help="The tenant.")],
    name: Annotated[str, typer.Argument(help="The queue name.")],
    quota_gpus: Annotated[
        float | None, typer.Option("--quota", min=0, help="GPUs; omit to remove the cap.")
    ] = None,
) -> None:
    """Change (or remove) a queue's GPU quota."""
    with client() as pool:
        queue = pool.set_quota(tenant, name, quota_gpus)
    print(
        f"{queue.tenant}/{queue.name} quota {'none' if queue.quota_gpus is None else f'{queue.quota_gpus:g}'}"
    )


@app.command("ls")
@reports_errors
def list_queues(
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="Only this tenant.")] = None,
) -> None:
    """List queues with their quota, use and lengths."""
    from rich.table import Table

    with client() as pool:
        queues = pool.queues(tenant)
    table = Table(title=f"{len(queues)} queue(s)")
    for column in ("TENANT/QUEUE", "QUOTA GPUS", "USED GPUS", "RUNNING", "PENDING"):
        table.add_column(column)
    for q in queues:
        quota = "-" if q.quota_gpus is None else f"{q.quota_gpus:g}"
        table.add_row(f"{q.tenant}/{q.name}", quota, f"{q.used_gpus:g}", str(q.running), str(q.pending))
    console().print(table)
