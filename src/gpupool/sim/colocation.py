"""Inference services and batch on one pool, against a static split (issue 39, item 6).

The replay protocol of sim/replay.py drives it: every decision is the core's (`cycle_on`).

Services. Each GPU instance of the service trace (sim/traces/alibaba_serving.py) is a replica: a
one-pod workload of the pool's serving class (`serving.priority_class` of the configuration the
setup was built from: `serving`, above every batch class) that arrives when
the instance was created and whose demand ends when it was deleted, whenever it was placed. A
replica placed late serves only the rest of its lifetime; one whose demand ends before it is placed
is dropped. A replica is ready `cold_start_s` after it is placed. Its demand seconds (up to the
trace's end) count as met on time when it was placed within `grace_s` of its rise, else only the
seconds after it became ready count.

Batch. Philly jobs (whole-device gangs, classes drawn as sim/jobs.py draws them, checkpointing
every 30 minutes) cloned `batch_scale` times on average (seeded), all preemptible; a preempted job
resumes from its last checkpoint and the work since is lost (the core picks the least-lost-work
victims).

Variants, each on the same nodes:
- static: two clusters, an inference pool of the fewest nodes that hold the services' peak and a
  batch cluster of the other nodes; two replays, nothing crosses.
- colocated: one pool; a replica that finds no room preempts batch.
- headroom: colocated, with the live pool's `serving.headroom_replicas`: the core's admission
  (`core/scheduling/headroom.py`, `Policies.headroom`) admits new batch only while room for that many
  more replicas of the largest replica's shape stays free, as `gpupool up` does.
- fractional: headroom, and a replica whose instance asks for less than a device gets a slice of
  one (rounded up to a quarter, at least 0.25); `assume_share` (a sensitivity, not the trace)
  gives every whole-device replica that share instead.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpupool.core.metering import PriceBook
from gpupool.core.model import Node, PodRequest, Reason, Workload
from gpupool.core.scheduling.cycle import CycleResult, Policies, Wait
from gpupool.core.scheduling.headroom import Headroom, for_services, keeps
from gpupool.core.scheduling.packing import emptiest_first
from gpupool.core.units import MILLI
from gpupool.errors import InvalidInput, did_you_mean
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import Replay, ReplayConfig
from gpupool.sim.traces.alibaba_serving import ServiceInstance

VARIANTS = ("static", "colocated", "headroom", "fractional")
SERVICE_CLASS = "serving"
"""The replicas' class where the setup names none: the configuration's default `serving.priority_class`."""
SERVICE_TENANT = "services"
COLD_START_S = 30.0
"""Placement to ready replica: pulling a cached image and loading a DLRM shard (an assumption)."""
GRACE_S = 30.0
"""A replica placed within this long of its rise in demand is on time."""
HEADROOM_REPLICAS = 8
BATCH_SCALE = 1.6
TIMELINE_POINTS = 400


def parse_variants(text: str) -> tuple[str, ...]:
    """'static,colocated' -> the variants in VARIANTS order; an unknown one names its nearest."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names:
        raise InvalidInput(f"Give at least one variant: {', '.join(VARIANTS)}.")
    for name in names:
        if name not in VARIANTS:
            raise InvalidInput(f"Unknown variant {name!r}; choose from {', '.join(VARIANTS)}."
                               + did_you_mean(name, list(VARIANTS)))
    return tuple(v for v in VARIANTS if v in names)


def replica_milli(instance: ServiceInstance, fractional: bool, assume_share: float | None) -> int:
    """Milli-devices of one device a replica holds (whole devices: MILLI per device)."""
    if instance.gpus >= 1:
        if fractional and assume_share is not None and instance.gpus == 1:
            return round(assume_share * MILLI)
        return MILLI
    if not fractional:
        return MILLI  # one device each, as the trace's scheduler gave it
    return max(250, math.ceil(instance.gpus * 4) * 250)


def service_jobs(instances: Sequence[ServiceInstance], fractional: bool = False,
                 assume_share: float | None = None, priority_class: str = SERVICE_CLASS) -> list[TraceJob]:
    """The replicas as workloads of the serving class (duration: the instance's lifetime)."""
    out = []
    for inst in instances:
        milli = replica_milli(inst, fractional, assume_share)
        devices = max(1, int(inst.gpus)) if milli == MILLI else 1
        pod = PodRequest(name="replica", num_devices=devices, device_milli=milli)
        w = Workload(id=f"svc-{inst.app}-{inst.line}", pods=(pod,), tenant=SERVICE_TENANT, queue="default",
                     priority_class=priority_class, submit_time_s=inst.start_s, name=inst.app)
        out.append(TraceJob(w, inst.start_s, inst.end_s - inst.start_s))
    return out


def thin_instances(instances: Sequence[ServiceInstance], every: int, seed: int = 0) -> list[ServiceInstance]:
    """A 1/`every` scale model of the services: of each app's instances (in order of start), every
    `every`-th one from an offset the seed picks, so each app keeps its shape at 1/`every` of its size
    (an app with fewer instances than `every` may keep none)."""
    if every < 1:
        raise InvalidInput(f"--service-thin must be a whole number >= 1 (8 keeps one instance in 8), "
                           f"not {every}.")
    if every == 1:
        return list(instances)
    offset = seed % every
    by_app: dict[str, list[ServiceInstance]] = {}
    for inst in sorted(instances, key=lambda i: (i.start_s, i.line)):
        by_app.setdefault(inst.app, []).append(inst)
    kept = [inst for group in by_app.values() for k, inst in enumerate(group) if k % every == offset]
    return sorted(kept, key=lambda i: (i.start_s, i.line))


def scale_batch(jobs: Sequence[TraceJob], factor: float, seed: int, shift_s: float = 0.0) -> list[TraceJob]:
    """Each job `floor(factor)` times, plus once more with the fraction's probability (seeded); the
    clones arrive with the original, `shift_s` earlier (the trace's window start moved to 0)."""
    if not factor > 0 or not math.isfinite(factor):
        raise InvalidInput(f"--batch-scale must be a number above 0 (0.2 takes one job in five, 1.5 each "
                           f"job once and half of them twice), not {factor:g}.")
    rng = random.Random(f"batch-scale:{seed}")
    whole, frac = int(factor), factor - int(factor)
    out = []
    for job in jobs:
        copies = whole + (1 if rng.random() < frac else 0)
        for k in range(copies):
            w = job.workload
            at = job.submit_s - shift_s
            clone = replace(w, id=w.id if k == 0 else f"{w.id}-c{k}", submit_time_s=at)
            out.append(TraceJob(clone, at, job.duration_s))
    out.sort(key=lambda j: (j.submit_s, j.workload.id))
    return out


def widest_fitting(jobs: Sequence[TraceJob], devices: int) -> tuple[list[TraceJob], int]:
    """The jobs that ask for at most `devices` devices, and how many asked for more."""
    kept = [j for j in jobs if j.workload.total_device_milli <= devices * MILLI]
    return kept, len(jobs) - len(kept)


def static_inference_nodes(instances: Sequence[ServiceInstance], nodes: Sequence[Node]) -> int:
    """Nodes of the static split's inference pool: the fewest that hold the services' peak."""
    per_node = max((len(n.devices) for n in nodes), default=1) * MILLI
    return max(1, math.ceil(peak_milli(service_jobs(instances)) / per_node))


def peak_milli(jobs: Sequence[TraceJob]) -> int:
    """The most milli-devices the replicas ask for at once."""
    events = []
    for j in jobs:
        events.append((j.submit_s, j.workload.total_device_milli))
        events.append((j.submit_s + j.duration_s, -j.workload.total_device_milli))
    events.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


@dataclass(frozen=True, slots=True)
class ColocationSetup:
    nodes: tuple[Node, ...]
    instances: tuple[ServiceInstance, ...]
    batch: tuple[TraceJob, ...]
    policies: Policies
    """The pool's policies, from its configuration (cli/sim_colocate.py: `PoolConfig.policies`)."""
    end_s: float
    """The services' window end (the trace's last time): their demand is counted up to it."""
    seed: int = 0
    headroom_replicas: int = HEADROOM_REPLICAS
    """`serving.headroom_replicas` under the headroom and fractional variants."""
    service_class: str = SERVICE_CLASS
    """The replicas' class (`serving.priority_class`)."""
    exempt_classes: frozenset[str] = frozenset({SERVICE_CLASS})
    """The classes the headroom is kept for (`serving.priority_class` and `serving.classes`)."""
    cold_start_s: float = COLD_START_S
    grace_s: float = GRACE_S
    assume_share: float | None = None
    prices: PriceBook | None = None
    check_invariants: bool = False
    wide_jobs_left_out: int = 0
    """Batch jobs wider than the static split's batch cluster, left out of every variant."""
    consolidate: bool = False
    """`serving.pack_replicas`: when an app's instance ends, the app's ready replica on the emptiest
    node is removed (the core's `packing.emptiest_first`, as the live controller scales down) and the
    ending instance's replica serves the rest of that one's demand."""


class ColocationReplay(Replay):
    """The replay with replicas whose demand ends at a time, not after an amount of work; the
    headroom, if any, is the core's (`config.policies.headroom`)."""

    def __init__(self, config: ReplayConfig, ends: dict[str, float], end_s: float = math.inf,
                 consolidate: bool = False, cold_start_s: float = COLD_START_S) -> None:
        super().__init__(config)
        self.ends = ends
        self.consolidate = consolidate
        self.cold_start_s = cold_start_s
        self.serves_until = dict(ends)
        """The demand end each replica serves now (a consolidation hands one replica's end to another)."""
        self.app_running: dict[str, set[str]] = {}
        self.consolidations = 0
        """Instance ends at which another replica of the app was removed in its place."""
        self.headroom: Headroom | None = config.policies.headroom
        self.end_s = end_s
        self.placed: dict[str, float] = {}
        self.dropped: set[str] = set()
        self.submitted: dict[str, float] = {}
        self.finished_at: dict[str, float] = {}
        self.service_milli = 0
        self.batch_held = 0
        """Cycles in which the core held back some pending batch for the headroom (`serving_headroom`)."""
        self.headroom_reservations = 0
        """Cycles whose backfill reservation went to a head held for the headroom (the core reserves
        for it as for any head that cannot start, so smaller batch may not delay it)."""
        self.headroom_breaches = 0
        """Cycles after which batch admitted this cycle left less than the headroom free."""
        self.last_s = 0.0
        self.batch_device_s_window = 0.0
        self.service_device_s_window = 0.0
        self.timeline: list[tuple[float, float, float]] = []
        self.service_preemptions = 0
        self.result: dict[str, Any] = {}

    def run(self) -> dict[str, Any]:
        for wid, end in self.ends.items():
            if math.isfinite(end):
                self.loop.schedule(end, "demand_end", wid)
        for job in self.config.jobs:
            self.submitted[job.workload.id] = job.submit_s
        self.result = super().run()
        return self.result

    def _batch(self, now_s: float, events: Sequence[Any]) -> None:
        self._integrate(now_s)
        for event in events:
            if event.kind == "demand_end" and event.payload in self.pending:
                job = self.pending.pop(event.payload)
                self.pending_workloads.pop(event.payload)
                self.metrics.pending_change(job.job, -1.0)
                self.dropped.add(event.payload)
        allocated_before = self.view.state.allocated_device_milli - self.service_milli
        super()._batch(now_s, events)
        state = self.view.state
        batch_now = state.allocated_device_milli - self.service_milli
        if self.headroom is not None and batch_now > allocated_before and not keeps(self.headroom, state):
            self.headroom_breaches += 1
        if not self.timeline or self.timeline[-1][0] != now_s:
            self.timeline.append((now_s, self.service_milli / MILLI, batch_now / MILLI))
        else:
            self.timeline[-1] = (now_s, self.service_milli / MILLI, batch_now / MILLI)

    def _integrate(self, now_s: float) -> None:
        """Device-seconds held by each side from the last event to now, clipped to the window."""
        upto = min(now_s, self.end_s)
        if upto > self.last_s:
            span = upto - self.last_s
            batch = self.view.state.allocated_device_milli - self.service_milli
            self.batch_device_s_window += span * batch / MILLI
            self.service_device_s_window += span * self.service_milli / MILLI
        self.last_s = max(self.last_s, upto)

    def _apply(self, result: CycleResult, now_s: float) -> None:
        if self.headroom is not None:
            held = {d.workload_id for d in result.decisions
                    if type(d) is Wait and d.reason is Reason.SERVING_HEADROOM}
            if held:
                self.batch_held += 1
                reserve = result.reservation
                if reserve is not None and reserve.workload_id in held:
                    self.headroom_reservations += 1
        super()._apply(result, now_s)

    def _start(self, wid: str, now_s: float) -> None:
        end = self.ends.get(wid)
        if end is not None:
            self.app_running.setdefault(self.pending_workloads.by_id()[wid].name, set()).add(wid)
            end = self.serves_until[wid]
            self.pending[wid].remaining_s = max(0.0, end - now_s)
            self.placed[wid] = now_s
            self.service_milli += self.pending_workloads.by_id()[wid].total_device_milli
        super()._start(wid, now_s)
        if end is not None and not math.isfinite(end):
            job = self.jobs[wid]
            if job.token is not None:  # live to the end of the replay: no end event
                self.loop.cancel(job.token)
                job.token = None

    def _finish(self, wid: str, now_s: float) -> None:
        if wid in self.ends:
            if self.consolidate:
                wid = self._removed_instead(wid, now_s)
            self.service_milli -= self.jobs[wid].job.workload.total_device_milli
            self.app_running[self.jobs[wid].job.workload.name].discard(wid)
        super()._finish(wid, now_s)
        self.finished_at[wid] = now_s

    def _ready(self, wid: str, now_s: float) -> bool:
        placed = self.placed.get(wid)
        return placed is not None and placed + self.cold_start_s <= now_s

    def _removed_instead(self, wid: str, now_s: float) -> str:
        """The replica to remove as `wid`'s demand ends: of the app's ready replicas, the one on the
        emptiest node (`emptiest_first`); when it is another, `wid`'s replica (ready too) goes on
        serving that one's demand to its end."""
        if not self._ready(wid, now_s):
            return wid
        app = self.jobs[wid].job.workload.name
        ready = sorted(r for r in self.app_running.get(app, ()) if self._ready(r, now_s))
        if len(ready) < 2:
            return wid
        state = self.view.state
        used = np.where(state.dev_valid, state.dev_milli_cap - state.dev_milli_free, 0).sum(axis=1)
        nodes = {r: self.view.running[r].allocs[0][1].node for r in ready}
        other = emptiest_first([(r, nodes[r]) for r in ready],
                               {n: float(used[n]) for n in set(nodes.values())})[0]
        if used[nodes[other]] >= used[nodes[wid]]:
            return wid  # no emptier node: the trace's own instance ends
        job, gone = self.jobs[wid], self.jobs[other]
        until = self.serves_until[other]
        self.serves_until[wid] = until
        self._progress(job, now_s)
        if math.isfinite(until):
            job.remaining_s = max(0.0, until - now_s)
            self._reschedule(job, now_s)
        else:
            job.token = None  # serves to the end of the replay
        if gone.token is not None:
            self.loop.cancel(gone.token)
        self.consolidations += 1
        return other

    def _stop(self, wid: str, now_s: float, kind: Any) -> float:
        if wid in self.ends:  # never for a non-preemptible class; counted if the core ever did
            self.app_running[self.jobs[wid].job.workload.name].discard(wid)
            self.service_preemptions += 1
            self.service_milli -= self.jobs[wid].job.workload.total_device_milli
            self.placed.pop(wid, None)
        return super()._stop(wid, now_s, kind)


def _interval(values: list[float]) -> dict[str, float]:
    """Mean and a 95 % interval (t distribution) over seeds."""
    arr = np.asarray(values, dtype=float)
    mean = float(arr.mean()) if len(arr) else 0.0
    if len(arr) < 2:
        return {"mean": mean, "lo": mean, "hi": mean, "n": len(arr)}
    t = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}
    half = t.get(len(arr), 1.96) * float(arr.std(ddof=1)) / math.sqrt(len(arr))
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": len(arr)}


def interval(values: list[float]) -> dict[str, float]:
    return _interval(values)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else 0.0


def _downsample(timeline: list[tuple[float, float, float]], points: int) -> list[list[float]]:
    if len(timeline) <= points:
        return [list(p) for p in timeline]
    step = len(timeline) / points
    return [list(timeline[int(i * step)]) for i in range(points)]


def _replay(setup: ColocationSetup, nodes: tuple[Node, ...], jobs: list[TraceJob], ends: dict[str, float],
            headroom: Headroom | None) -> ColocationReplay:
    policies = replace(setup.policies, headroom=headroom)
    config = ReplayConfig(nodes, tuple(jobs), policies, seed=setup.seed, prices=setup.prices,
                          check_invariants=setup.check_invariants)
    run = ColocationReplay(config, ends, setup.end_s, setup.consolidate and bool(ends), setup.cold_start_s)
    run.run()
    return run


def run_variant(setup: ColocationSetup, variant: str,
                keep: list[ColocationReplay] | None = None) -> dict[str, Any]:
    """One variant's metrics (JSON-ready); `keep` gets its replays (static: the inference pool's,
    then the batch cluster's)."""
    if variant not in VARIANTS:
        raise InvalidInput(f"Unknown variant {variant!r}; choose from {', '.join(VARIANTS)}."
                           + did_you_mean(variant, list(VARIANTS)))
    fractional = variant == "fractional"
    services = service_jobs(setup.instances, fractional, setup.assume_share, setup.service_class)
    ends = {j.workload.id: j.submit_s + j.duration_s for j in services}
    batch = list(setup.batch)
    # the live pool's rule (server/serving/headroom.py): room for N replicas of the largest one
    headroom = (for_services(setup.headroom_replicas, {(p.num_devices, p.device_milli) for j in services
                                                        for p in j.workload.pods}, setup.exempt_classes)
                if variant in ("headroom", "fractional") else None)
    info: dict[str, Any] = {"variant": variant, "devices": sum(len(n.devices) for n in setup.nodes)}
    if variant == "static":
        inference_nodes = min(len(setup.nodes), static_inference_nodes(setup.instances, setup.nodes))
        serving_nodes, batch_nodes = setup.nodes[:inference_nodes], setup.nodes[inference_nodes:]
        if not batch_nodes:
            raise InvalidInput(f"The pool has {len(setup.nodes)} nodes and the services' peak needs "
                               f"{inference_nodes}: no batch cluster is left; give a larger --cluster.")
        svc = _replay(setup, serving_nodes, services, ends, None)
        bat = _replay(setup, batch_nodes, batch, {}, None)
        info["inference_devices"] = sum(len(n.devices) for n in serving_nodes)
        info["batch_devices"] = sum(len(n.devices) for n in batch_nodes)
        runs = [svc, bat]
    else:
        one = _replay(setup, setup.nodes, services + batch, ends, headroom)
        svc = bat = one
        runs = [one]
    info["service_demand_peak_gpus"] = peak_milli(services) / MILLI
    if keep is not None:
        keep.extend(runs)
    info.update(_service_metrics(setup, services, ends, svc))
    info.update(_batch_metrics(setup, batch, bat))
    info["preemptions"] = sum(r.metrics.preemptions for r in runs)
    info["lost_batch_gpu_hours"] = sum(r.metrics.lost_device_s for r in runs) / 3600
    info["service_preemptions"] = sum(r.service_preemptions for r in runs)
    info["consolidations"] = sum(r.consolidations for r in runs)
    info["headroom_replicas"] = headroom.replicas if headroom else 0
    info["headroom_held_cycles"] = bat.batch_held
    info["headroom_breaches"] = bat.headroom_breaches
    info["headroom_reservations"] = bat.headroom_reservations
    info["service_gpu_hours_window"] = svc.service_device_s_window / 3600
    info["cycles"] = sum(r.cycles for r in runs)
    info["wall_s"] = sum(r.result["wall_s"] for r in runs)
    info["timeline"] = _timeline(runs, setup.end_s)
    if setup.prices is not None:
        info["cost"] = _cost(runs, info, setup.end_s)
    return info


def _timeline(runs: list[ColocationReplay], end_s: float) -> list[list[float]]:
    """(time, service GPUs, batch GPUs) over the window; the static split's two clusters summed."""
    if len(runs) == 1:
        return _downsample([p for p in runs[0].timeline if p[0] <= end_s], TIMELINE_POINTS)
    merged: list[tuple[float, float, float]] = []
    a, b = runs[0].timeline, runs[1].timeline
    i = j = 0
    svc = bat = 0.0
    while i < len(a) or j < len(b):
        if j >= len(b) or (i < len(a) and a[i][0] <= b[j][0]):
            t, svc = a[i][0], a[i][1]
            i += 1
        else:
            t, bat = b[j][0], b[j][2]
            j += 1
        if t > end_s:
            break
        if merged and merged[-1][0] == t:
            merged[-1] = (t, svc, bat)
        else:
            merged.append((t, svc, bat))
    return _downsample(merged, TIMELINE_POINTS)


def _cost(runs: list[ColocationReplay], info: dict[str, Any], end_s: float) -> dict[str, Any]:
    """The window's cost under the price book (its rate per device-hour, as the meter priced the
    replay's runs): the pool's, the services' and batch's share of it, and what each batch GPU-hour
    delivered cost (the pool less the services' part, over batch GPU-hours)."""
    cost = hours = 0.0
    currency = "USD"
    for r in runs:
        report = r.result.get("cost")
        if report:
            currency = report["currency"]
            cost += report["total"]["pooled_cost"]
            hours += report["total"]["device_hours"]
    rate = cost / hours if hours else 0.0
    pool = rate * info["devices"] * end_s / 3600
    services = rate * info["service_gpu_hours_window"]
    batch = rate * info["batch_gpu_hours_window"]
    return {"currency": currency, "per_device_hour": round(rate, 4), "pool": round(pool, 2),
            "services": round(services, 2), "batch": round(batch, 2),
            "idle": round(pool - services - batch, 2),
            "per_batch_gpu_hour": round((pool - services) / max(info["batch_gpu_hours_window"], 1e-9), 4)}


def _service_metrics(setup: ColocationSetup, services: list[TraceJob], ends: dict[str, float],
                     run: ColocationReplay) -> dict[str, Any]:
    demand = met = 0.0
    ready: list[float] = []
    never = 0
    rises = {inst.line for inst in setup.instances if inst.created_in_trace}
    for job, inst in zip(services, setup.instances, strict=True):
        wid = job.workload.id
        rise, end = job.submit_s, min(ends[wid], setup.end_s)
        if end <= rise:
            continue
        seconds = (end - rise) * job.workload.total_device_milli / MILLI
        demand += seconds
        placed = run.placed.get(wid)
        if placed is None:
            never += 1
        elif placed - rise <= setup.grace_s:
            met += seconds
        else:
            met += max(0.0, end - placed - setup.cold_start_s) * job.workload.total_device_milli / MILLI
        if inst.line in rises:
            if placed is not None:
                ready.append(placed - rise + setup.cold_start_s)
            else:
                ready.append(max(0.0, end - rise) + setup.cold_start_s)  # never ready: its whole demand
    return {
        "replicas": len(services),
        "service_demand_gpu_hours": demand / 3600,
        "service_on_time_pct": 100.0 * met / demand if demand else 100.0,
        "replicas_never_placed": never,
        "time_to_ready_s": {"mean": float(np.mean(ready)) if ready else 0.0, "p50": _pct(ready, 50),
                            "p99": _pct(ready, 99), "max": max(ready, default=0.0), "rises": len(ready)},
    }


def _batch_metrics(setup: ColocationSetup, batch: list[TraceJob], run: ColocationReplay) -> dict[str, Any]:
    jct = [run.finished_at[j.workload.id] - j.submit_s for j in batch if j.workload.id in run.finished_at]
    # work that never finished (a gang that found no whole nodes free once the replay had nothing
    # else to do) is counted to the replay's last event: a lower bound on its JCT
    end = run.loop.clock.now_s
    censored = jct + [max(0.0, end - j.submit_s) for j in batch if j.workload.id not in run.finished_at]
    # what never finished, by width (a whole-node gang among scattered replicas may never find its node)
    # and the work it still had to do (GPU-hours): starvation counted, not dropped from the means
    by_width: dict[str, int] = {}
    left_h = 0.0
    for j in batch:
        wid = j.workload.id
        if wid in run.finished_at:
            continue
        gpus = j.workload.total_device_milli / MILLI
        by_width[f"{gpus:g}"] = by_width.get(f"{gpus:g}", 0) + 1
        state = run.jobs.get(wid)
        remaining = state.remaining_s if state is not None else j.duration_s
        left_h += remaining * gpus / 3600
    return {
        "batch_unfinished_by_gpus": dict(sorted(by_width.items(), key=lambda kv: float(kv[0]))),
        "batch_unfinished_gpu_hours": left_h,
        "batch_jobs": len(batch),
        "batch_finished": len(jct),
        "batch_unfinished": len(batch) - len(jct),
        "batch_jct_with_unfinished_s": {"mean": float(np.mean(censored)) if censored else 0.0,
                                        "p95": _pct(censored, 95)},
        "batch_jct_s": {"mean": float(np.mean(jct)) if jct else 0.0, "p50": _pct(jct, 50),
                        "p95": _pct(jct, 95)},
        "batch_gpu_hours_window": run.batch_device_s_window / 3600,
        "batch_gpu_hours_total": sum(j.duration_s * j.workload.total_device_milli / MILLI
                                     for j in batch) / 3600,
    }


def run_all(setup: ColocationSetup, variants: Sequence[str] = VARIANTS) -> dict[str, Any]:
    """Every variant on the same setup, and the ratios against the static split where it ran."""
    results = {v: run_variant(setup, v) for v in variants}
    out: dict[str, Any] = {"variants": results, "wide_jobs_left_out": setup.wide_jobs_left_out}
    base = results.get("static")
    if base is not None:
        out["vs_static"] = {
            v: {"batch_gpu_hours": r["batch_gpu_hours_window"] / max(base["batch_gpu_hours_window"], 1e-9),
                "jct_mean_speedup": base["batch_jct_s"]["mean"] / max(r["batch_jct_s"]["mean"], 1e-9)}
            for v, r in results.items() if v != "static"}
    return out
