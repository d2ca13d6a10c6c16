"""`gpupool ls`: list workloads, newest first, as a table, JSON or bare ids (-o).

In a table the pending tasks of an array fold into one row, as squeue shows them: `ID_[5-999%50]`
(the indexes still pending, and the array's limit); tasks that were placed have rows of their own.
`--expand` gives every task its row; `-o json` and `-o name` always list every task. A list page
carries what each workload asks for (`request`), not its command or environment: `-o json --full`
(or `gpupool show`) has those.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from gpupool.cli._common import SIMULATED_MARK, ago, client, flags_for_fields, reports_errors
from gpupool.cli._reconnect import DEFAULT_RECONNECT_S, Reconnecting, ReconnectOption
from gpupool.cli.output import Column, Format, OutputOption

TABLE_LIMIT = 50
"""Rows a table shows unless --limit says otherwise (-o name and -o json list everything)."""
JSON_PAGE = 1000
FOLDED_WIDTH = 40
"""Most characters of a folded array row's index list (`-o json` has every task)."""


@reports_errors
@flags_for_fields(since_s="--since", status="--status", tenant="--tenant", queue="--queue", limit="--limit")
def ls(
    targets: Annotated[list[str] | None, typer.Argument(
        help="Only these arrays (every task of each) or workloads, by id or unique prefix.")] = None,
    status: Annotated[list[str] | None, typer.Option(
        "--status", "-s", help="Only these statuses, any case, several or a comma list: -s succeeded,failed.")
    ] = None,
    tenant: Annotated[list[str] | None, typer.Option(
        "--tenant", "-t", help="Admin: only these tenants (a comma list); an unknown one is an error.")
    ] = None,
    queue: Annotated[list[str] | None, typer.Option(
        "--queue", "-q", help="Only these queues (a comma list); an unknown one is an error.")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="Only work submitted since: 1h, 7d, or a date (2026-12-01, 2026-12-01T08:00).")
    ] = None,
    limit: Annotated[int | None, typer.Option(
        "--limit", "-l", min=1, help=f"At most this many (default {TABLE_LIMIT} in a table, all otherwise).")
    ] = None,
    expand: Annotated[bool, typer.Option(
        "--expand", "-r", help="A row for every pending task of an array (like squeue -r); by default "
        "they fold into one row ID_[INDEXES%LIMIT].")] = False,
    full: Annotated[bool, typer.Option(
        "--full", help="With -o json: each workload whole, with its spec (command, environment); by "
        "default what it asks for (request) without them.")] = False,
    output: OutputOption = Format.TABLE,
    watch: Annotated[bool, typer.Option(
        "--watch", help="Redraw the table every --interval seconds until Ctrl-C (exit 0); rides out a "
        "server restart for up to --reconnect seconds.")] = False,
    interval: Annotated[float, typer.Option(
        "--interval", min=0.1, max=3600, metavar="SECONDS", help="With --watch: seconds between redraws.")
    ] = 2.0,
    reconnect: ReconnectOption = DEFAULT_RECONNECT_S,
) -> None:
    """List workloads, newest first (an array's tasks, when it is named: in index order).

    The table keeps a workload to one line at 80 columns: node names without the prefix they share
    and (sim) said once under it; on a narrow terminal long names are cut with an ellipsis (piped,
    never). -o wide has every column, whole.

    Example: gpupool ls -s failed,cancelled --since 1d -o name | xargs gpupool show

    Example: gpupool ls w-1a2b3c4d5e6f   (the tasks of that array)

    Example: gpupool ls --watch --interval 5 -s pending,running

    Exit codes: 0 ok, 2 bad usage, 3 an unknown tenant or queue (or forbidden), 4 unreachable.
    """
    since_s = None
    if since is not None:
        from gpupool.cli._durations import since_s as parse_since

        since_s = parse_since(since)
    filters: dict[str, Any] = {"status": status or (), "tenant": tenant, "queue": queue, "since_s": since_s}
    if watch and output not in (Format.TABLE, Format.WIDE):
        print(f"Error: --watch redraws a table; give -o table or -o wide, not -o {output.value}.",
              file=sys.stderr)
        raise typer.Exit(2)
    with client() as pool:
        if targets:
            from gpupool.cli._targets import resolve_targets

            chosen = resolve_targets(pool, targets)
            filters["array_id"] = [t.id for t in chosen if t.is_array] or None
            filters["workload_id"] = [t.id for t in chosen if not t.is_array] or None
        if output is Format.NAME:
            from gpupool.cli.output import names

            names(pool.workload_ids(**filters, limit=limit))
            return
        if output is Format.JSON:
            from gpupool.cli.output import as_json

            as_json(_all(pool, {**filters, "full": full}, limit))
            return
        if watch:
            _watch(pool, filters, limit, expand, output, interval, Reconnecting(reconnect))
            return
        page = pool.workloads(**filters, limit=min(limit or TABLE_LIMIT, JSON_PAGE))
        items, tasks = (page.items, {}) if expand else _fold(pool, page.items)
    _table(items, page.total, output, tasks, _pinned(filters))


def _pinned(filters: dict[str, Any]) -> bool:
    """Whether the filter names one tenant and one queue (each may be a comma list)."""
    def one(values: list[str] | None) -> bool:
        names = {v.strip() for value in values or [] for v in value.split(",") if v.strip()}
        return len(names) == 1

    return one(filters.get("tenant")) and one(filters.get("queue"))


CLEAR = "\x1b[H\x1b[2J"
"""Home and erase the screen: each redraw replaces the last on a terminal."""


def _watch(pool: Any, filters: dict[str, Any], limit: int | None, expand: bool, output: Format,
           interval_s: float, retry: Reconnecting) -> None:
    """Redraw the table every `interval_s` until Ctrl-C. On a terminal each view replaces the last;
    piped, views follow one another, each under a line with its time."""
    import time

    try:
        while True:
            page = retry.call(lambda: pool.workloads(**filters, limit=min(limit or TABLE_LIMIT, JSON_PAGE)))
            shown = page.items
            items, tasks = (shown, {}) if expand else retry.call(lambda s=shown: _fold(pool, s))  # type: ignore[misc]
            stamp = time.strftime("%H:%M:%S")
            tty = sys.stdout.isatty()
            sys.stdout.write(f"{CLEAR}Every {interval_s:g}s, at {stamp} (Ctrl-C to stop)\n" if tty
                             else f"--- {stamp}\n")
            sys.stdout.flush()
            _table(items, page.total, output, tasks, _pinned(filters))
            sys.stdout.flush()
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return


def _fold(pool: Any, items: list[Any]) -> tuple[list[Any], dict[str, int]]:
    """The rows of a table: each array's pending tasks as one row `ID_[INDEXES%LIMIT]` where its
    first one was, and how many tasks each folded row stands for."""
    from gpupool.api.array_spec import compact

    rows: list[Any] = []
    tasks: dict[str, int] = {}
    folded: set[str] = set()
    for w in items:
        if w.array_id is None or w.status != "pending":
            rows.append(w)
            continue
        if w.array_id in folded:
            continue
        folded.add(w.array_id)
        ids = pool.workload_ids(array_id=w.array_id, status=["pending"])
        indexes = sorted(int(i.rpartition("_")[2]) for i in ids)
        if len(indexes) <= 1:
            rows.append(w)
            continue
        limit = f"%{w.array_limit}" if w.array_limit is not None else ""
        shown = compact(indexes)
        if len(shown) > FOLDED_WIDTH:  # a sparse array: the first indexes, then how many more
            shown = shown[:shown.rfind(",", 0, FOLDED_WIDTH)] + ",..."
        row_id = f"{w.array_id}_[{shown}{limit}]"
        rows.append(w.model_copy(update={"id": row_id}))
        tasks[row_id] = len(indexes)
    return rows, tasks


def _all(pool: Any, filters: dict[str, Any], limit: int | None) -> list[Any]:
    """Every matching workload (up to `limit`), read a page of 1000 at a time."""
    items: list[Any] = []
    while limit is None or len(items) < limit:
        size = JSON_PAGE if limit is None else min(JSON_PAGE, limit - len(items))
        page = pool.workloads(**filters, limit=size, offset=len(items))
        items += page.items
        if len(page.items) < size or len(items) >= page.total:
            break
    return items


def _table(items: list[Any], total: int, output: Format, tasks: dict[str, int] | None = None,
           pinned: bool = False) -> None:
    """`tasks`: how many tasks each folded array row stands for (its GPUS are theirs in all);
    `pinned`: the filter names one tenant and one queue, so `total` counts that queue's work only.

    The table (not `-o wide`) keeps a workload to one line at 80 columns: no borders, node names
    without the prefix they all share, the queue in the title when every row has the same one, an
    age rather than a date, and what is abbreviated said once under the table."""
    tasks = tasks or {}
    import time

    from gpupool.cli.output import render

    now = time.time()
    wide = output is Format.WIDE
    every_node = sorted({p.node for w in items for p in _placed(w)})
    prefix = "" if wide else common_prefix(every_node)
    simulated = {p.node for w in items for p in _placed(w) if p.simulated}
    mixed = bool(simulated) and simulated != set(every_node)

    def nodes(w: Any) -> str:
        shown = sorted({p.node for p in _placed(w)})
        if wide:
            return ",".join(shown) + (f" {SIMULATED_MARK}" if w.simulated else "") if shown else "-"
        return ",".join(n[len(prefix):] + ("*" if mixed and n in simulated else "") for n in shown) or "-"

    def when(epoch_s: float | None) -> str:
        from gpupool.cli._durations import when as local

        return local(epoch_s)

    queues = {f"{w.tenant}/{w.queue}" for w in items}
    one_queue = not wide and len(queues) == 1
    columns: list[Column[Any]] = [
        Column("ID", lambda w: w.id, key=True),
        Column("NAME", lambda w: w.name or "-", key=wide, squeeze=not wide),
        *([] if one_queue else [Column("TENANT/QUEUE" if wide else "QUEUE", lambda w: f"{w.tenant}/{w.queue}",
                                       squeeze=not wide)]),
        Column("STATUS", lambda w: w.status),
        Column("GPUS", lambda w: f"{_gpus(w) * tasks.get(w.id, 1):g}"),
        Column("NODE", nodes, squeeze=not wide),
        (Column("SUBMITTED", lambda w: ago(w.submit_s, now)) if wide
         else Column("AGE", lambda w: age(w.submit_s, now))),
        Column("PRIORITY", lambda w: str(w.priority), wide=True),
        Column("CLASS", lambda w: w.request.priority_class or "-", wide=True),
        Column("TIME LIMIT", lambda w: _limit(w.request.time_limit_s), wide=True),
        Column("ATTEMPT", lambda w: str(w.attempt), wide=True),
        Column("REPLICAS", lambda w: str(w.request.replicas), wide=True),
        Column("STARTED", lambda w: when(w.started_s), wide=True),
        Column("FINISHED", lambda w: when(w.finished_s), wide=True),
        Column("EXIT", lambda w: "-" if w.exit_code is None else str(w.exit_code), wide=True),
    ]
    if wide or any(_reason(w) for w in items):
        columns.append(Column("REASON", _reason, squeeze=not wide))
    title = f"{len(items)} of {total} workload(s)"
    if one_queue:  # the total may count other queues (-t bob,alice --limit 2) unless the filter pins one
        title += f" in {queues.pop()}" if pinned or len(items) >= total else \
            f", those shown in {queues.pop()}"
    footer = [] if wide else _footer(prefix, simulated, mixed)
    render(output, items, columns, key=lambda w: w.id, title=title, footer=footer)


def _placed(w: Any) -> list[Any]:
    """The pods whose nodes the NODE column shows: none for pending work, which holds no node (after
    a requeue its last attempt's pods are still listed, ended)."""
    return [] if w.status == "pending" else list(w.pods)


def _reason(w: Any) -> str:
    return str(w.reason or "") if w.status in ("pending", "failed") else ""


def _footer(prefix: str, simulated: set[str], mixed: bool) -> list[str]:
    """What the NODE column abbreviates, said once."""
    lines = [f"NODE: names after {prefix}"] if prefix else []
    if simulated:
        lines.append(f"{SIMULATED_MARK} " + ("the nodes marked * are simulated" if mixed
                                            else "every node shown is simulated"))
    return lines


def common_prefix(names: list[str]) -> str:
    """The part up to and including the last '-' that every one of `names` starts with ('' when
    none): h100-sxm-80gb-000 and h100-sxm-80gb-001 share h100-sxm-80gb-."""
    if not names:
        return ""
    first, last = min(names), max(names)
    size = 0
    while size < min(len(first), len(last)) and first[size] == last[size]:
        size += 1
    shared = first[:size]
    cut = shared.rfind("-") + 1
    return shared[:cut] if all(len(n) > cut for n in names) else ""


def age(epoch_s: float | None, now: float) -> str:
    """How long ago, in one short word: 45s, 12m, 5h, 3d ('-' when unknown)."""
    if epoch_s is None:
        return "-"
    delta = max(0.0, now - epoch_s)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if delta >= 2 * size:
            return f"{delta // size:.0f}{unit}"
    return f"{delta:.0f}s"


def _gpus(w: Any) -> float:
    """Devices the workload asks for in all (per pod x pods)."""
    return float(w.request.resources.gpus) * w.request.replicas


def _limit(seconds: float | None) -> str:
    """A time limit as Slurm prints one: D-HH:MM:SS, or HH:MM:SS under a day ('-' without one)."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock
