"""The services' autoscaler: Knative's KPA decision as a pure function of samples, policy and state.

Semantics (Knative Serving's KPA, the same names and defaults):

- A sample is what the data plane saw at one instant: requests in flight (concurrency) and requests
  per second. The serving loop takes one a second.
- A window of W seconds at time `now` holds the samples taken in (now - W, now]; its value is the
  mean of those samples. The stable window is 60 s, the panic window 6 s.
- With `ready` ready replicas (at least 1 counted, so a scale from zero divides by 1),
  the stable and panic wants are ceil(window value / target per replica), each bounded by the
  scale-up rate (at most ceil(rate x ready)) and the scale-down rate (at least floor(ready / rate)).
- Panic starts when panic want / ready >= the panic threshold (2.0 = 200 %), and lasts until a
  whole stable window has gone by without the threshold being crossed again. While panicking the
  panic want is used and never lowered (no scale-down while panicking).
- Outside panic the stable want is used. Zero is only chosen when `min_replicas` is 0, no sample in
  the stable window saw any traffic, and the last traffic is older than the idle grace period.
- The result is clamped to [min_replicas, max_replicas].

No I/O, no clock: `now_s` and the samples come from the caller, so the same decision is reproduced
from the same inputs (the replay and the live loop call the same function).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum


class ScaleMetric(StrEnum):
    CONCURRENCY = "concurrency"
    """Requests in flight per replica."""
    RPS = "rps"
    """Requests per second per replica."""


@dataclass(frozen=True, slots=True)
class AutoscalePolicy:
    target_per_replica: float
    min_replicas: int = 0
    max_replicas: int = 8
    metric: ScaleMetric = ScaleMetric.CONCURRENCY
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0
    """Panic when the panic window wants this many times the ready replicas (2.0 = 200 %)."""
    max_scale_up_rate: float = 1000.0
    """At most ceil(rate x ready) replicas wanted at once (Knative's default 1000)."""
    max_scale_down_rate: float = 2.0
    """At least floor(ready / rate) replicas kept by one decision (Knative's default 2)."""
    scale_to_zero_grace_s: float = 30.0
    """How long after the last request a service with min 0 keeps its last replica."""

    def problems(self) -> list[str]:
        """What is wrong with this policy, each as a sentence saying the rule; empty when valid."""
        out: list[str] = []
        if not self.target_per_replica > 0:
            out.append(f"the target per replica must be above 0 (got {self.target_per_replica:g})")
        if self.min_replicas < 0:
            out.append(f"min replicas must be 0 or more (got {self.min_replicas})")
        if self.max_replicas < max(1, self.min_replicas):
            out.append(f"max replicas ({self.max_replicas}) must be at least 1 and at least min "
                       f"replicas ({self.min_replicas})")
        if not 0 < self.panic_window_s <= self.stable_window_s:
            out.append(f"the panic window ({self.panic_window_s:g} s) must be above 0 and no longer "
                       f"than the stable window ({self.stable_window_s:g} s)")
        if self.panic_threshold <= 1.0:
            out.append(f"the panic threshold must be above 1.0 (got {self.panic_threshold:g})")
        if self.max_scale_up_rate <= 1.0 or self.max_scale_down_rate <= 1.0:
            out.append("the scale-up and scale-down rates must be above 1.0")
        if self.scale_to_zero_grace_s < 0:
            out.append("the scale-to-zero grace period must be 0 s or more")
        return out


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float
    in_flight: float
    requests_per_s: float

    def value(self, metric: ScaleMetric) -> float:
        return self.in_flight if metric is ScaleMetric.CONCURRENCY else self.requests_per_s

    @property
    def has_traffic(self) -> bool:
        return self.in_flight > 0 or self.requests_per_s > 0


@dataclass(frozen=True, slots=True)
class AutoscaleState:
    """What one decision hands to the next (per service)."""

    panic_since_s: float | None = None
    """When the panic threshold was last crossed; None when not panicking."""
    max_panic_replicas: int = 0
    last_traffic_s: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    desired: int
    previous: int
    reason: str
    panicking: bool
    stable_value: float
    panic_value: float
    state: AutoscaleState

    @property
    def changed(self) -> bool:
        return self.desired != self.previous


def window_mean(samples: Sequence[Sample], now_s: float, window_s: float, metric: ScaleMetric) -> float:
    """The mean of the samples taken in (now_s - window_s, now_s]; 0.0 when there are none."""
    inside = [s.value(metric) for s in samples if now_s - window_s < s.at_s <= now_s]
    return sum(inside) / len(inside) if inside else 0.0


def _replicas_for(value: float, target: float, cap: int) -> int:
    """ceil(value / target), or `cap` where that is more: a tiny target makes the quotient infinite,
    which has no ceiling (every service's decision in the same tick would fail with it)."""
    wanted = value / target
    return math.ceil(wanted) if wanted < cap else cap


def _unit(metric: ScaleMetric) -> str:
    return "in flight" if metric is ScaleMetric.CONCURRENCY else "requests/s"


def decide(policy: AutoscalePolicy, samples: Sequence[Sample], ready: int, current: int,
           state: AutoscaleState, now_s: float) -> Decision:
    """The number of replicas the service should have now, and why (see the module docstring).

    `ready` is the replicas that pass their readiness probe, `current` the replicas last asked for.
    """
    metric = policy.metric
    stable = window_mean(samples, now_s, policy.stable_window_s, metric)
    panic = window_mean(samples, now_s, policy.panic_window_s, metric)
    traffic_at = [s.at_s for s in samples if s.at_s <= now_s and s.has_traffic]
    last_traffic = max([*traffic_at, *([state.last_traffic_s] if state.last_traffic_s is not None else [])],
                       default=None)
    counted = max(1, ready)
    up_bound = math.ceil(policy.max_scale_up_rate * counted)
    down_bound = math.floor(counted / policy.max_scale_down_rate)
    stable_want = min(max(_replicas_for(stable, policy.target_per_replica, up_bound), down_bound), up_bound)
    # capped where the cap changes neither the want (bounded by up_bound) nor the panic test below
    panic_raw = _replicas_for(panic, policy.target_per_replica,
                              max(up_bound, math.ceil(policy.panic_threshold * counted)))
    panic_want = min(max(panic_raw, down_bound), up_bound)
    over = panic_raw / counted >= policy.panic_threshold

    panic_since = state.panic_since_s
    max_panic = state.max_panic_replicas
    if over:
        panic_since = now_s
    elif panic_since is not None and panic_since + policy.stable_window_s < now_s:
        panic_since, max_panic = None, 0

    if panic_since is not None:
        max_panic = max(max_panic, panic_want, stable_want, current)
        want, value, window = max_panic, panic, f"the {policy.panic_window_s:g} s panic window"
    else:
        want, value, window = stable_want, stable, f"the {policy.stable_window_s:g} s stable window"

    idle_long = last_traffic is None or now_s - last_traffic >= policy.scale_to_zero_grace_s
    if want == 0 and current > 0 and not idle_long:
        want = 1  # the last replica stays through the grace period
    desired = min(max(want, policy.min_replicas), policy.max_replicas)

    target = f"a target of {policy.target_per_replica:g}"
    observed = f"{value:.1f} {_unit(metric)} against {target} over {window}"
    if desired == 0 and current > 0:
        reason = (f"scaled {current} → 0: no request over {window} and none for "
                  f"{policy.scale_to_zero_grace_s:g} s (the idle grace period)")
    elif desired != current:
        reason = f"scaled {current} → {desired}: {observed}"
    elif panic_since is not None and stable_want < desired:
        reason = f"held at {desired} while panicking (no scale-down): {observed}"
    else:
        reason = f"held at {desired}: {observed}"
    if desired == policy.max_replicas and want > desired:
        reason += f" (capped at max {policy.max_replicas})"
    new_state = replace(state, panic_since_s=panic_since, max_panic_replicas=max_panic,
                        last_traffic_s=last_traffic)
    return Decision(desired=desired, previous=current, reason=reason, panicking=panic_since is not None,
                    stable_value=stable, panic_value=panic, state=new_state)
