"""`gpupool queue create|ls`: a tenant's queues and their GPU quotas (admin)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpupool.cli._common import client, reports_errors
from gpupool.cli.output import Column, Format, OutputOption

app = typer.Typer(help="Queues and quotas (admin): create, ls, set-quota.\n\n"
                  "Example: gpupool queue create team-a batch --quota 4", no_args_is_help=True)


@app.command()
@reports_errors
def create(
    tenant: Annotated[str, typer.Argument(help="The tenant that owns it.")],
    name: Annotated[str, typer.Argument(help="The queue name.")],
    quota_gpus: Annotated[
        float | None, typer.Option("--quota", min=0, help="GPUs its running work may hold.")
    ] = None,
) -> None:
    """Create a queue for a tenant, optionally with a GPU quota.

    Example: gpupool queue create team-a batch --quota 4
    """
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
    """Change (or remove) a queue's GPU quota.

    Example: gpupool queue set-quota team-a batch --quota 8
    """
    with client() as pool:
        queue = pool.set_quota(tenant, name, quota_gpus)
    print(
        f"{queue.tenant}/{queue.name} quota {'none' if queue.quota_gpus is None else f'{queue.quota_gpus:g}'}"
    )


@app.command("ls")
@reports_errors
def list_queues(
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="Only this tenant's.")] = None,
    output: OutputOption = Format.TABLE,
) -> None:
    """List queues with their quota, use and lengths.

    Example: gpupool queue ls -t team-a -o json
    """
    from gpupool.cli.output import render

    tenant = tenant.strip().lower() if tenant else None
    with client() as pool:
        queues = pool.queues(tenant)
        if not queues and tenant:
            known_tenant(pool, tenant)
    columns: list[Column[Any]] = [
        Column("TENANT/QUEUE", lambda q: f"{q.tenant}/{q.name}", key=True),
        Column("QUOTA GPUS", lambda q: "-" if q.quota_gpus is None else f"{q.quota_gpus:g}"),
        Column("USED GPUS", lambda q: f"{q.used_gpus:g}"),
        Column("RUNNING", lambda q: str(q.running)),
        Column("PENDING", lambda q: str(q.pending)),
    ]
    render(output, queues, columns, key=lambda q: f"{q.tenant}/{q.name}", title=f"{len(queues)} queue(s)")


def known_tenant(pool: Any, tenant: str) -> None:
    """NotFound (exit 3) unless `tenant` exists: an empty listing must not hide a typo."""
    from gpupool.errors import NotFound, did_you_mean

    names = [t.name for t in pool.tenants()]
    if tenant not in names:
        raise NotFound(f"No tenant {tenant!r}; list them with `gpupool tenant ls`."
                       + did_you_mean(tenant, names), tenant=tenant)
