"""`gpupool show ID...`: workloads in detail (where they run, their pods and events), or as JSON."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer

from gpupool.cli._common import SIMULATED_MARK, client, console, reports_errors
from gpupool.cli._targets import resolve_all
from gpupool.cli.output import Format, OutputOption
from gpupool.core.units import format_memory_mib


@reports_errors
def show(
    workload_ids: Annotated[
        list[str], typer.Argument(help="Workload ids (from submit or ls), or unique prefixes.")
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the workload as JSON (a list for several); as -o json.")
    ] = False,
    output: OutputOption = Format.TABLE,
) -> None:
    """Show workloads: status, reason, where they run, pods, events.

    -o json (or --json) prints the API's object (a list for several); -o name the ids; -o wide is
    the detail.

    Example: gpupool show w-1a2b

    Exit codes: 0 ok, 2 an ambiguous id prefix, 3 not found or forbidden, 4 server unreachable.
    """
    with client() as pool:
        workloads = [_with_network(pool, w) for w in resolve_all(pool, workload_ids)]
        if output is Format.NAME:
            from gpupool.cli.output import names

            names(w.id for w in workloads)
            return
        if as_json or output is Format.JSON:
            dumped = [w.model_dump(mode="json") for w in workloads]
            print(json.dumps(dumped[0] if len(dumped) == 1 else dumped, indent=2))
            return
        for i, workload in enumerate(workloads):
            if i:
                print()
            _show_one(pool, workload)


def _with_network(pool: Any, workload: Any) -> Any:
    """The workload as the detail route gives it: with its whole spec (list pages, which resolved
    the id, carry a summary) and, for a gang across nodes, its place in the fabric (listings leave
    that out: it costs a route computation per workload)."""
    whole = hasattr(workload, "spec")
    if whole and (len({p.node for p in workload.pods}) < 2 or workload.status not in ("admitted", "running")):
        return workload
    return pool.workload(workload.id)


def now_s() -> float:
    """The wall clock the relative times ("in 2h 10m") count from (tests replace it)."""
    return time.time()


def workdir_line(pool: Any, workload: Any) -> str:
    """Where its pods run and why (the node's agent says so once the pod has started)."""
    spec = workload.spec
    if spec.workdir:
        return f"workdir: {spec.workdir} (--workdir)"
    if not spec.submit_dir:
        return "workdir: private directory (no --workdir, and not submitted from a directory)"
    if workload.status == "pending" or not workload.pods:
        return (f"workdir: not chosen yet: {spec.submit_dir} (where submit ran) if the pod's account may "
                "enter it on its node, else its private directory")
    note = pool.logs(workload.id, rank=0, stream="notes").text.strip()
    return note or f"workdir: not recorded by the node (submitted from {spec.submit_dir})"


def requested_line(spec: Any) -> str:
    """What each replica asked for, as submitted (the slices held are in the pods table)."""
    r = spec.resources
    parts = [f"{r.gpus:g} GPU" if r.gpus else "no GPU"]
    if r.gpu_memory:
        parts.append(f"{r.gpu_memory} device memory")
    if r.cpu:
        parts.append(f"cpu {r.cpu}")
    if r.memory:
        parts.append(f"memory {r.memory}")
    if r.models:
        parts.append(f"models {', '.join(r.models)}")
    return f"requested: {spec.replicas} x ({', '.join(parts)})"


def network_line(network: Any) -> str:
    """Where a gang across nodes sits in the fabric (pools started with --fabric)."""
    where = f"network: {network.domain}, {network.hops} hops"
    if network.bottleneck is not None:
        where += f", bottleneck {network.bottleneck} at {network.bottleneck_gbps:.0f} Gb/s"
    return where + ("" if network.connected else "; cut off: some of its nodes have no route left")


def reason_lines(workload: Any) -> list[str]:
    """The last reason: its code and message, then what it means and what to do (the catalogue's)."""
    if not workload.reason:
        return []
    lines = [f"reason: {workload.reason}" + (f": {workload.message}" if workload.message else "")]
    if workload.reason_text:
        lines.append(f"  {workload.reason_text}")
    if workload.reason_hint:
        lines.append(f"  hint: {workload.reason_hint}")
    return lines


def scheduling_lines(workload: Any, now_s: float) -> list[str]:
    """What the scheduler records about it: class, attempt, retries, time limit, reservation, backoff,
    work lost and kept, and its array."""
    spec = workload.spec
    klass = f"class {spec.priority_class}, " if spec.priority_class else ""
    limit = duration_text(workload.time_limit_s) if workload.time_limit_s else "none"
    lines = [f"scheduling: {klass}priority {workload.priority}, attempt {workload.attempt}, "
             f"retries {workload.retries} of {workload.max_retries}, time limit {limit}"]
    if workload.array_id is not None:
        throttle = f" (at most {workload.array_limit} at once)" if workload.array_limit else ""
        lines.append(f"array: {workload.array_id} index {workload.array_index}{throttle}")
    if workload.reserved_start_s is not None:
        lines.append(f"reserved start: {at_text(workload.reserved_start_s)} "
                     f"({relative_text(workload.reserved_start_s, now_s)}; backfill holds room for it)")
    if workload.not_before_s is not None and workload.status == "pending" and workload.not_before_s > now_s:
        lines.append(f"retry backoff: not placed before {at_text(workload.not_before_s)} "
                     f"({relative_text(workload.not_before_s, now_s)})")
    if workload.lost_device_s or workload.progress_s or workload.run_s:
        lines.append(f"work: lost {device_time_text(workload.lost_device_s)} to preemptions and evictions; "
                     f"kept {duration_text(workload.progress_s)} from checkpoints; "
                     f"ran {duration_text(workload.run_s)} in earlier attempts")
    return lines


def at_text(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch_s))


def duration_text(seconds: float) -> str:
    """90061 -> '1d 1h 1m', 7800 -> '2h 10m', 90 -> '1m 30s', 59.5 -> '59.5s' (seconds under an hour)."""
    if seconds < 60:
        return f"{seconds:.3g}s" if seconds else "0s"
    whole = int(seconds)
    days, hours, mins, secs = whole // 86400, whole % 86400 // 3600, whole % 3600 // 60, whole % 60
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "", f"{mins}m" if mins else "",
             f"{secs}s" if secs and whole < 3600 else ""]
    return " ".join(p for p in parts if p)


def relative_text(epoch_s: float, now_s: float) -> str:
    """'in 2h 10m', '5m ago' or 'now'."""
    delta = epoch_s - now_s
    if abs(delta) < 1:
        return "now"
    return f"in {duration_text(delta)}" if delta > 0 else f"{duration_text(-delta)} ago"


def device_time_text(device_s: float) -> str:
    """Device-seconds as GPU-hours and GPU-seconds: '0.03 GPU-hours (100 GPU-seconds)'."""
    return f"{device_s / 3600:.2f} GPU-hours ({device_s:.0f} GPU-seconds)"


def slices_text(slices: Any) -> str:
    """Each slice held: dev<index>:<share of compute>/<device memory>, e.g. dev0:0.25/20GiB."""
    held = [f"dev{s.device_index}:{s.compute_milli / 1000:g}"
            + (f"/{format_memory_mib(s.memory_mib)}" if s.memory_mib else "") for s in slices]
    return ", ".join(held) or "-"


def times_line(workload: Any, now_s: float | None = None) -> str:
    """Submitted, started and ended (local time), and how long it has run."""

    def at(epoch: float | None) -> str:
        return "-" if epoch is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))

    line = (f"submitted {at(workload.submit_s)}, started {at(workload.started_s)}, "
            f"ended {at(workload.finished_s)}")
    if workload.started_s is not None:
        end = workload.finished_s if workload.finished_s is not None else (now_s or time.time())
        line += f", elapsed {max(0.0, end - workload.started_s):.1f} s"
    return line


def unenforced_sentences(pool: Any, workload: Any, events: list[Any]) -> list[str]:
    """Which of its limits are not enforced where its pods are, from each node's layers as `gpupool
    node ls` reports them (the node says it once for every workload there, so the server writes no
    event per workload); a `limits_unenforced` event a workload got from an older server is kept."""
    said = {e.message for e in events if e.reason == "limits_unenforced"}
    r = workload.spec.resources
    gpus = float(r.gpus or 0)
    shares = 0 < gpus < 1 or bool(gpus and r.gpu_memory)
    for name in sorted({p.node for p in workload.pods}):
        host = any(p.cpu_milli or p.memory_mib for p in workload.pods if p.node == name)
        said.update(_node_sentences(pool, name, shares, host))
    return sorted(said)


def _node_sentences(pool: Any, name: str, shares: bool, host: bool) -> list[str]:
    """One sentence per limit a pod on node `name` asks for that the node does not enforce: a device
    share (`shares`: its device_limits layer) and host cpu or memory (`host`: host_limits)."""
    if not (shares or host):
        return []
    from gpupool.errors import Forbidden, NotFound

    try:
        layers = {state.layer: state for state in pool.node(name).enforcement}
    except (NotFound, Forbidden):  # the node left the pool (or this token may not read it)
        return []
    sentences = []
    device, cpu = layers.get("device_limits"), layers.get("host_limits")
    if shares and device is not None and not device.enforced:
        sentences.append(f"device compute and memory limits are not enforced on node {name}: {device.detail}")
    if host and cpu is not None and not cpu.enforced:
        sentences.append(f"host cpu and memory limits are not enforced on node {name}: {cpu.detail}")
    return sentences


def control_lines(workload: Any) -> list[str]:
    """Its dependency (and the part it still waits for) and its hold, when it has them."""
    lines = []
    if workload.spec.dependency:
        waits = f"; waits for {workload.waiting_on}" if workload.waiting_on else ""
        kept = "" if workload.spec.kill_on_invalid_dep else " (--kill-on-invalid-dep no)"
        lines.append(f"dependency: {workload.spec.dependency}{kept}{waits}")
    if workload.held:
        lines.append(f"held by the {workload.held}: `gpupool release {workload.id}` lets it be placed")
    return lines


def _show_one(pool: Any, workload: Any) -> None:
    events = pool.events(workload.id)
    from rich.table import Table

    out = console()
    out.print(
        f"[bold]{workload.id}[/bold] {workload.name}  {workload.tenant}/{workload.queue}  "
        f"[bold]{workload.status}[/bold]"
        + (f"  exit {workload.exit_code}" if workload.exit_code is not None else "")
    )
    plain = {"markup": False, "highlight": False, "soft_wrap": True}
    for line in reason_lines(workload):
        out.print(line, **plain)
    for line in control_lines(workload):
        out.print(line, **plain)
    out.print(f"command: {' '.join(workload.spec.command)}", markup=False)
    out.print(requested_line(workload.spec), **plain)
    now = now_s()
    for line in scheduling_lines(workload, now):
        out.print(line, **plain)
    out.print(times_line(workload, now), **plain)
    out.print(workdir_line(pool, workload), **plain)
    if getattr(workload, "network", None) is not None:
        out.print(network_line(workload.network), **plain)
    for sentence in unenforced_sentences(pool, workload, events):
        out.print(f"[bold]not enforced:[/bold] {sentence}")
    pods = Table(title="pods (the slices, cpu and memory each holds)")
    for column in ("POD", "STATUS", "NODE", "SLICES", "CPU", "MEMORY", "EXIT"):
        pods.add_column(column)
    for p in workload.pods:
        pods.add_row(
            p.id,
            p.status,
            p.node + (f" {SIMULATED_MARK}" if p.simulated else ""),
            slices_text(p.slices),
            f"{p.cpu_milli / 1000:g}" if p.cpu_milli else "-",
            format_memory_mib(p.memory_mib) if p.memory_mib else "-",
            "-" if p.exit_code is None else str(p.exit_code),
        )
    out.print(pods)
    table = Table(title="events")
    for column in ("AT", "FROM", "TO", "REASON", "MESSAGE"):
        table.add_column(column)
    for e in events:
        table.add_row(
            time.strftime("%H:%M:%S", time.localtime(e.at_s)),
            e.from_status or "-",
            e.to_status,
            e.reason,
            e.message or e.reason_text,
        )
    out.print(table)
