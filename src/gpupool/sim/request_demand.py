"""A service's replica demand derived from its requests through the autoscaler (core/autoscale.py).

Input: the Azure LLM inference trace 2023 (``TIMESTAMP,ContextTokens,GeneratedTokens``, one row a
request; Patel et al., "Splitwise", ISCA'24). Each request is in flight from its arrival for
``prefill_s_per_token * ContextTokens + decode_s_per_token * GeneratedTokens`` (an assumption: one
replica's speed, not measured here). Every second the autoscaler (Knative's KPA, the function the
live pool calls) is handed a sample (requests in flight, requests in the last second) and decides
the replicas; a replica asked for is ready `cold_start_s` later. The result is the replica demand
over time that a service driven by these requests would put on the pool.
"""

from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpupool.core.autoscale import AutoscalePolicy, AutoscaleState, Sample, decide
from gpupool.errors import InvalidInput, TraceError
from gpupool.sim.traces.alibaba_serving import ServiceInstance

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
PREFILL_S_PER_TOKEN = 0.0002
"""Prefill at 5,000 tokens/s (an assumption of the order of one large-model replica)."""
DECODE_S_PER_TOKEN = 0.03
"""Decode at 33 tokens/s for one request (an assumption of the same kind)."""


@dataclass(frozen=True, slots=True)
class Request:
    at_s: float
    context_tokens: int
    generated_tokens: int


def load_requests(path: str | Path) -> list[Request]:
    """The requests, arrival times in seconds from the first one, sorted."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"Request trace file {path} does not exist; give an Azure LLM 2023 CSV file.")
    stamps: list[tuple[float, int, int]] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise TraceError(f"{path}:1: the header lacks column(s) {', '.join(missing)}; an Azure LLM "
                             "2023 trace has TIMESTAMP,ContextTokens,GeneratedTokens.")
        at = {c: header.index(c) for c in COLUMNS}
        for values in reader:
            if not values or all(not v.strip() for v in values):
                continue
            where = f"{path}:{reader.line_num}"
            if len(values) != len(header):
                raise TraceError(f"{where}: expected {len(header)} fields as in the header, "
                                 f"found {len(values)}.")
            stamp = values[at["TIMESTAMP"]].strip()
            try:
                day, _, clock = stamp.partition(" ")
                whole, _, frac = clock.partition(".")
                moment = datetime.fromisoformat(f"{day} {whole}").replace(tzinfo=UTC).timestamp()
                moment += float(f"0.{frac}") if frac else 0.0
            except ValueError:
                raise TraceError(f"{where}: TIMESTAMP must look like 2023-11-16 18:17:03.9799600, "
                                 f"got {stamp!r}.") from None
            try:
                ctx, gen = int(values[at["ContextTokens"]]), int(values[at["GeneratedTokens"]])
            except ValueError:
                raise TraceError(f"{where}: ContextTokens and GeneratedTokens must be whole "
                                 "numbers.") from None
            if ctx < 0 or gen < 0:
                raise TraceError(f"{where}: token counts must be 0 or more.")
            stamps.append((moment, ctx, gen))
    if not stamps:
        raise TraceError(f"{path}:1: the file has a header but no requests.")
    stamps.sort()
    first = stamps[0][0]
    return [Request(t - first, c, g) for t, c, g in stamps]


def replica_demand(requests: list[Request], policy: AutoscalePolicy, cold_start_s: float = 30.0,
                   prefill_s_per_token: float = PREFILL_S_PER_TOKEN,
                   decode_s_per_token: float = DECODE_S_PER_TOKEN) -> dict[str, Any]:
    """Replicas over time (one decision a second, until the autoscaler could have scaled to zero
    after the last request) and what they add up to."""
    problems = policy.problems()
    if problems:
        raise InvalidInput("The autoscale policy is invalid: " + "; ".join(problems) + ".")
    starts = [r.at_s for r in requests]
    ends = sorted(r.at_s + prefill_s_per_token * r.context_tokens + decode_s_per_token * r.generated_tokens
                  for r in requests)
    # on past the last request until the autoscaler could have scaled to zero
    horizon = math.ceil(max(ends) + policy.stable_window_s + policy.scale_to_zero_grace_s + 1)
    state = AutoscaleState()
    samples: list[Sample] = []
    desired = policy.min_replicas
    asked: list[tuple[float, int]] = [(0.0, desired)]  # (when, desired) to read readiness from
    timeline: list[tuple[float, int, int, float]] = []
    steps: list[tuple[float, int]] = [(0.0, desired)]
    events: list[str] = []
    replica_s = 0.0
    window = policy.stable_window_s
    for second in range(1, horizon + 1):
        now = float(second)
        in_flight = bisect.bisect_right(starts, now) - bisect.bisect_right(ends, now)
        arrived = bisect.bisect_right(starts, now) - bisect.bisect_right(starts, now - 1.0)
        samples.append(Sample(now, float(in_flight), float(arrived)))
        while samples and samples[0].at_s <= now - window:
            samples.pop(0)
        ready_at = now - cold_start_s
        ready = next((d for t, d in reversed(asked) if t <= ready_at), 0)
        ready = min(ready, desired)  # a scale-down takes effect at once
        decision = decide(policy, samples, ready, desired, state, now)
        state = decision.state
        if decision.changed:
            events.append(f"{now:.0f} s: {decision.reason}")
            asked.append((now, decision.desired))
        if decision.desired != desired:
            steps.append((now, decision.desired))
        desired = decision.desired
        replica_s += desired
        timeline.append((now, desired, ready, float(in_flight)))
    peak = max(t[1] for t in timeline)
    return {
        "requests": len(requests),
        "span_s": horizon,
        "replicas_max": peak,
        "replicas_mean": replica_s / max(horizon, 1),
        "in_flight_max": max(t[3] for t in timeline),
        "scale_events": len(events),
        "first_events": events[:10],
        "timeline": [list(t) for t in timeline[:: max(1, len(timeline) // 400)]],
        "steps": [list(t) for t in steps],
    }


def repeated_instances(steps: list[tuple[float, int]] | list[list[float]], period_s: float, until_s: float,
                       app: str, gpus: float = 1.0, first_line: int = 10_000_000) -> list[ServiceInstance]:
    """The autoscaler's decisions (`steps`: (time, desired replicas) at each change, from
    `replica_demand`) as replicas of one service, the whole span repeated back to back every
    `period_s` up to `until_s` (an assumption: the trace has one hour). A scale-up starts that many
    replicas; a scale-down ends the newest first. Replicas still live at a period's end end there."""
    if not period_s > 0:
        raise InvalidInput(f"The repetition period must be above 0 seconds, not {period_s:g}.")
    out: list[ServiceInstance] = []
    line = first_line
    offset = 0.0
    while offset < until_s:
        live: list[float] = []  # start times, newest last
        for at, want in steps:
            t = offset + float(at)
            if t >= until_s or float(at) >= period_s:
                break
            while len(live) < int(want):
                live.append(t)
            while len(live) > int(want):
                out.append(ServiceInstance(line, f"{app}-{line}", app, "req", gpus, live.pop(), t,
                                           created_in_trace=True))
                line += 1
        end = min(offset + period_s, until_s)
        for start in reversed(live):
            out.append(ServiceInstance(line, f"{app}-{line}", app, "req", gpus, start, end,
                                       created_in_trace=True))
            line += 1
        offset += period_s
    return sorted(out, key=lambda i: (i.start_s, i.line))
