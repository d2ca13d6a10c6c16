"""The KPA autoscaler: the windows' exact meaning, panic, scale to zero, bounds and reasons."""

from __future__ import annotations

import itertools
import math

from gpupool.core.autoscale import (
    AutoscalePolicy,
    AutoscaleState,
    Decision,
    Sample,
    ScaleMetric,
    decide,
    window_mean,
)

CONC = ScaleMetric.CONCURRENCY


def flat(start_s: float, end_s: float, in_flight: float, rps: float = 0.0) -> list[Sample]:
    """One sample a second at start_s, start_s + 1, ... end_s (inclusive)."""
    return [Sample(float(t), in_flight, rps) for t in range(int(start_s), int(end_s) + 1)]


def run(policy: AutoscalePolicy, samples: list[Sample], ready: int, current: int, now_s: float,
        state: AutoscaleState | None = None) -> Decision:
    return decide(policy, samples, ready, current, state or AutoscaleState(), now_s)


def test_a_window_holds_the_samples_after_its_start_up_to_now() -> None:
    samples = [Sample(94.0, 100.0, 0.0), *flat(95, 100, 6.0)]
    # (94, 100]: the sample at 94 is out, the six at 95..100 are in
    assert window_mean(samples, 100.0, 6.0, CONC) == 6.0
    # (93.5, 99.5]: the samples at 94..99, one of 100 and five of 6
    assert window_mean(samples, 99.5, 6.0, CONC) == (100 + 30) / 6
    assert window_mean(samples, 200.0, 6.0, CONC) == 0.0
    assert window_mean([Sample(101.0, 9.0, 0.0)], 100.0, 6.0, CONC) == 0.0  # the future is not seen


def test_the_stable_window_sets_the_replicas_outside_panic() -> None:
    policy = AutoscalePolicy(target_per_replica=4, max_replicas=20)
    d = run(policy, flat(41, 100, 10.0), ready=2, current=2, now_s=100.0)
    assert (d.desired, d.panicking) == (3, False)  # ceil(10 / 4); 10 / 4 / 2 < 2: no panic
    assert d.reason == "scaled 2 → 3: 10.0 in flight against a target of 4 over the 60 s stable window"


def test_a_burst_over_200_percent_panics_on_the_6_s_window() -> None:
    policy = AutoscalePolicy(target_per_replica=4, max_replicas=20)
    samples = flat(41, 94, 2.0) + flat(95, 100, 19.4)
    d = run(policy, samples, ready=2, current=2, now_s=100.0)
    assert d.panicking and d.desired == 5  # ceil(19.4 / 4) = 5 >= 2 x 2 ready
    assert d.reason == "scaled 2 → 5: 19.4 in flight against a target of 4 over the 6 s panic window"
    # one replica fewer wanted by the panic window would be 4 = exactly 200 % of 2: still panic
    d4 = run(policy, flat(41, 94, 2.0) + flat(95, 100, 16.0), ready=2, current=2, now_s=100.0)
    assert d4.panicking and d4.desired == 4
    d3 = run(policy, flat(41, 94, 2.0) + flat(95, 100, 12.0), ready=2, current=2, now_s=100.0)
    assert not d3.panicking


def test_no_scale_down_while_panicking_and_panic_ends_one_stable_window_after_the_last_crossing() -> None:
    policy = AutoscalePolicy(target_per_replica=4, max_replicas=20)
    burst = flat(95, 100, 40.0)
    d = run(policy, burst, ready=1, current=1, now_s=100.0)
    assert d.panicking and d.desired == 10 and d.state.panic_since_s == 100.0
    quiet = burst + flat(101, 130, 0.5)
    held = run(policy, quiet, ready=10, current=10, now_s=130.0, state=d.state)
    assert held.panicking and held.desired == 10
    assert held.reason.startswith("held at 10 while panicking (no scale-down)")
    still = run(policy, quiet + flat(131, 160, 0.5), ready=10, current=10, now_s=160.0, state=held.state)
    assert still.panicking and still.desired == 10  # 160 is not after 100 + 60
    after = run(policy, quiet + flat(131, 161, 0.5), ready=10, current=10, now_s=161.0, state=still.state)
    assert not after.panicking
    assert after.desired == 5  # the stable want is 1, but one decision keeps floor(10 / 2)
    assert after.state.max_panic_replicas == 0


def test_scale_up_rate_bounds_one_decision() -> None:
    policy = AutoscalePolicy(target_per_replica=1, max_replicas=100, max_scale_up_rate=2.0)
    d = run(policy, flat(95, 100, 50.0), ready=3, current=3, now_s=100.0)
    assert d.desired == 6  # ceil(2.0 x 3), not 50


def test_min_and_max_clamp_and_the_cap_is_said() -> None:
    policy = AutoscalePolicy(target_per_replica=1, min_replicas=2, max_replicas=4)
    up = run(policy, flat(41, 100, 9.0), ready=4, current=4, now_s=100.0)
    assert up.desired == 4 and up.reason.endswith("(capped at max 4)")
    idle = run(policy, [], ready=4, current=4, now_s=1000.0)
    assert idle.desired == 2  # floor(4 / 2) and the minimum agree


def test_scale_to_zero_waits_for_an_idle_stable_window_and_the_grace_period() -> None:
    policy = AutoscalePolicy(target_per_replica=4, min_replicas=0, scale_to_zero_grace_s=30.0)
    samples = [Sample(10.0, 1.0, 1.0), *flat(11, 100, 0.0)]
    busy = run(policy, samples, ready=1, current=1, now_s=69.0)
    assert busy.desired == 1  # the request at 10 is still in (9, 69]
    d = run(policy, samples, ready=1, current=1, now_s=70.0)
    assert d.desired == 0
    assert d.reason == ("scaled 1 → 0: no request over the 60 s stable window and none for 30 s "
                        "(the idle grace period)")
    longer = AutoscalePolicy(target_per_replica=4, min_replicas=0, scale_to_zero_grace_s=90.0)
    assert run(longer, samples, ready=1, current=1, now_s=99.0).desired == 1
    assert run(longer, samples, ready=1, current=1, now_s=100.0).desired == 0
    kept = AutoscalePolicy(target_per_replica=4, min_replicas=1)
    assert run(kept, samples, ready=1, current=1, now_s=100.0).desired == 1


def test_a_held_request_scales_from_zero() -> None:
    policy = AutoscalePolicy(target_per_replica=4, min_replicas=0)
    d = run(policy, [*flat(90, 99, 0.0), Sample(100.0, 1.0, 0.0)], ready=0, current=0, now_s=100.0)
    assert d.desired == 1 and d.reason.startswith("scaled 0 → 1: ")


def test_requests_per_second_as_the_metric() -> None:
    policy = AutoscalePolicy(target_per_replica=100, metric=ScaleMetric.RPS, max_replicas=10)
    d = run(policy, flat(41, 100, 1.0, rps=250.0), ready=1, current=1, now_s=100.0)
    assert d.desired == 3  # ceil(250 / 100); 3 / 1 >= 2: panicking too, same want
    assert "250.0 requests/s against a target of 100" in d.reason


def test_the_same_inputs_give_the_same_decision() -> None:
    policy = AutoscalePolicy(target_per_replica=3, max_replicas=9)
    samples = flat(1, 30, 7.0) + flat(31, 36, 20.0)
    assert run(policy, samples, 2, 2, 36.0) == run(policy, samples, 2, 2, 36.0)


def test_policy_problems_say_the_rule() -> None:
    assert AutoscalePolicy(target_per_replica=4).problems() == []
    problems = AutoscalePolicy(target_per_replica=0, min_replicas=5, max_replicas=2).problems()
    assert "the target per replica must be above 0 (got 0)" in problems
    assert "max replicas (2) must be at least 1 and at least min replicas (5)" in problems


def test_a_target_near_zero_wants_the_most_replicas_the_bounds_allow() -> None:
    """ceil(load / 5e-324) is the ceiling of an infinite quotient, which Python cannot take: the want is
    capped where the cap changes neither the replicas wanted nor whether the panic window decides."""
    for target in (5e-324, 1e-300, 1e-9):
        for threshold, rate in ((2.0, 1000.0), (3.0, 1.5)):
            policy = AutoscalePolicy(target_per_replica=target, max_replicas=50, panic_threshold=threshold,
                                     max_scale_up_rate=rate)
            d = run(policy, flat(41, 100, 6.0), ready=2, current=2, now_s=100.0)
            assert d.panicking and d.desired == min(50, math.ceil(rate * 2)), (target, threshold, rate, d)
    # the same decisions as the plain quotient wherever it is finite
    from gpupool.core import autoscale

    def plain(value: float, target: float, cap: int) -> int:
        return math.ceil(value / target)

    loads = (0.0, 3.0, 19.4, 400.0)
    for target, rate, load in itertools.product((0.01, 0.25, 4.0), (1.5, 4.0, 1000.0), loads):
        policy = AutoscalePolicy(target_per_replica=target, max_replicas=1000, max_scale_up_rate=rate)
        samples = flat(41, 94, 2.0) + flat(95, 100, load)
        capped = run(policy, samples, ready=3, current=3, now_s=100.0)
        original, autoscale._replicas_for = autoscale._replicas_for, plain  # type: ignore[assignment]
        try:
            assert run(policy, samples, ready=3, current=3, now_s=100.0) == capped, (target, rate, load)
        finally:
            autoscale._replicas_for = original
