"""`gpupool cancel ID... | --name NAME | --all`: cancel workloads and arrays (their pods are stopped)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from gpupool.cli._common import client, reports_errors
from gpupool.cli._targets import resolve_targets
from gpupool.errors import Conflict, NotFound

ACTIVE = ("pending", "admitted", "running")
PAGE = 1000


def _active(pool: Any, *, name: str | None, tenant: str | None, queue: str | None) -> list[str]:
    """Ids of the unfinished workloads that match (all collected before any is cancelled)."""
    ids: list[str] = []
    while True:
        page = pool.workloads(status=ACTIVE, name=name, tenant=tenant, queue=queue, limit=PAGE,
                              offset=len(ids))
        ids += [w.id for w in page.items]
        if not page.items or len(ids) >= page.total:
            return ids


def _cancel_each(pool: Any, ids: list[str], *, quiet_if_finished: bool) -> tuple[int, int]:
    """(cancelled, exit code): errors are reported one line each and the rest still cancelled."""
    done, code = 0, 0
    for workload_id in ids:
        try:
            workload = pool.cancel(workload_id)
        except Conflict as exc:  # it finished meanwhile
            if not quiet_if_finished:
                print(f"Error: {exc.message}", file=sys.stderr)
                code = code or exc.exit_code
            continue
        except NotFound as exc:
            print(f"Error: {exc.message}", file=sys.stderr)
            code = code or exc.exit_code
            continue
        done += 1
        if not quiet_if_finished:
            print(f"{workload.id} {workload.status}")
    return done, code


def _cancel_array(pool: Any, array_id: str) -> int:
    """Cancel an array's unfinished tasks and say how many; 2 (as for a finished workload) when every
    task had already finished."""
    done = pool.cancel_array(array_id)
    if not done.cancelled:
        print(f"Error: Array {array_id} already finished (all {done.finished} tasks); there is nothing to "
              "cancel.", file=sys.stderr)
        return Conflict.exit_code
    finished = f" ({done.finished} had finished)" if done.finished else ""
    print(f"{array_id} array: cancelled {done.cancelled} task{'' if done.cancelled == 1 else 's'}{finished}")
    return 0


@reports_errors
def cancel(
    workload_ids: Annotated[
        list[str] | None, typer.Argument(help="Workload or array ids, or unique prefixes of them (an "
                                         "array: every unfinished task of it).")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="Every unfinished workload of this name.")
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every unfinished workload you may see.")] = False,
    tenant: Annotated[
        str | None, typer.Option("--tenant", "-t", help="With --all or --name: this tenant's only.")
    ] = None,
    queue: Annotated[
        str | None, typer.Option("--queue", "-q", help="With --all or --name: this queue's only.")
    ] = None,
) -> None:
    """Cancel workloads: by id (or unique prefix), by --name, or --all (with a count printed). An
    array's id cancels its unfinished tasks in one request and prints `ID array: cancelled N tasks`.

    Example: gpupool cancel --all --queue batch

    Exit codes: 0 cancelled, 2 bad usage, an ambiguous prefix or already finished, 3 not found,
    4 server unreachable.
    """
    chosen = sum([bool(workload_ids), name is not None, all_])
    if chosen != 1:
        print("Error: give workload ids, --name NAME or --all (exactly one of them).", file=sys.stderr)
        raise typer.Exit(2)
    if (tenant or queue) and workload_ids:
        print("Error: --tenant and --queue go with --all or --name, not with ids.", file=sys.stderr)
        raise typer.Exit(2)
    with client() as pool:
        if workload_ids:
            targets = resolve_targets(pool, workload_ids)
            code = 0
            for array in (t for t in targets if t.is_array):
                code = _cancel_array(pool, array.id) or code
            ids = [t.id for t in targets if not t.is_array]
            _, each_code = _cancel_each(pool, ids, quiet_if_finished=False)
            code = code or each_code
            if code:
                raise typer.Exit(code)
            return
        ids = _active(pool, name=name, tenant=tenant, queue=queue)
        if name is not None and not ids and not pool.workloads(name=name, tenant=tenant, queue=queue,
                                                              limit=1).items:
            raise NotFound(f"No workload is named {name!r}; list yours with `gpupool ls`.")
        done, code = _cancel_each(pool, ids, quiet_if_finished=True)
    print(f"cancelled {done} workload{'' if done == 1 else 's'}")
    if code:
        raise typer.Exit(code)


