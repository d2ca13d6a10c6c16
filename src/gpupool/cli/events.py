"""`gpupool events [ID...] [-f] [--tenant T]`: workload events, one line each, as they are stored;
`gpupool events --services [NAME...]`: service events (scaled, cold starts, replicas replaced ...).

Reads `GET /events/stream` (server-sent events): the events stored now (after --after), and with
-f those that follow too, until Ctrl-C (exit 0). A dropped connection is resumed from the last event received
(Last-Event-ID), so a server restart loses and repeats nothing; after --reconnect seconds of failing,
exit 4.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from gpupool.cli._common import client, reports_errors
from gpupool.cli._reconnect import DEFAULT_RECONNECT_S, ReconnectOption
from gpupool.cli._targets import resolve
from gpupool.cli.output import visible

if TYPE_CHECKING:
    from gpupool.client import Client


@reports_errors
def events(
    workload_ids: Annotated[list[str] | None, typer.Argument(
        help="Only these workloads (ids or unique prefixes); default: every workload you may see.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")]
    = False,
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="Admin: only this tenant's events "
                                               "(a tenant token always sees only its own).")] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table: one line per event; json: one "
                                        "JSON object per line (the API's event).")] = "table",
    after: Annotated[int, typer.Option("--after", min=0, metavar="EVENT_ID", help="Only events after "
                                       "this one (its `id` in -o json): resume where a run stopped.")] = 0,
    reconnect: ReconnectOption = DEFAULT_RECONNECT_S,
    services: Annotated[bool, typer.Option("--services", help="Service events instead (scaled, cold "
                                           "starts, replicas replaced, rollout steps, degraded): the "
                                           "arguments are then service names. Their ids are their own.")]
    = False,
) -> None:
    """Print workload events (submitted, admitted, running, succeeded ...), oldest first: those
    stored (after --after), then with -f new ones as they happen.

    Example: gpupool events -f

    Example: gpupool events -f --tenant team-a w-1a2b

    Example: gpupool events --services -f chat

    Exit codes: 0 ok (also Ctrl-C with -f), 2 bad usage, 3 a workload or tenant not found, 4 server
    unreachable (after --reconnect).
    """
    if output not in ("table", "json"):
        print(f"Error: --output takes table or json, not {output!r}.", file=sys.stderr)
        raise typer.Exit(2)
    with client() as pool:
        if services:
            _service_events(pool, workload_ids or [], follow, tenant, output, after, reconnect)
            return
        ids = [resolve(pool, given).id for given in workload_ids or []]
        try:
            for event in pool.stream_events(tenant=tenant, workload_ids=ids, follow=follow, after=after,
                                            reconnect_s=reconnect if follow else 0.0):
                if output == "json":
                    line = event.model_dump_json()
                else:
                    at = time.strftime("%H:%M:%S", time.localtime(event.at_s))
                    move = f"{event.from_status or '-'} -> {event.to_status}"
                    line = f"{at}  {event.workload_id}  {move:<22}  {event.reason:<18}  {event.message}"
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
        except KeyboardInterrupt:
            return


def _service_events(pool: Client, names: list[str], follow: bool, tenant: str | None, output: str,
                    after: int, reconnect: float) -> None:
    try:
        for event in pool.stream_service_events(tenant=tenant, services=names, follow=follow, after=after,
                                                reconnect_s=reconnect if follow else 0.0):
            if output == "json":
                line = event.model_dump_json()
            else:
                at = time.strftime("%H:%M:%S", time.localtime(event.at_s))
                line = visible(f"{at}  {event.tenant}/{event.service}  {event.reason:<18}  {event.message}")
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return
