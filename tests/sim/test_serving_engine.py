"""The serving engine on tiny traces whose times can be worked out by hand, one per mode."""

from __future__ import annotations

import math

import pytest

from gpupool.sim.serving.engine import MIXED_FACTOR, EngineOptions, Instance, ServingSim
from gpupool.sim.serving.network import KVNetwork
from gpupool.sim.serving.profiles import StepProfile
from gpupool.sim.serving.trace import Request

# prefill: 0.1 ms a token (500 tokens: 50 ms); decode: 10 ms a step whatever the batch
FLAT = StepProfile("m", "h100-80gb", 8, (0.0, 1000.0), (0.0, 100.0), (10.0, 0.0, 0.0, 0.0), 1.0)
KV_BYTES = 1_000_000  # 500 tokens: 500 MB, 10 ms at 400 Gb/s


def _inst(index: int, role: str, node: int) -> Instance:
    return Instance(index, role, node, FLAT, kv_capacity=100_000)


def _run(instances: list[Instance], requests: list[Request], **opts: object) -> ServingSim:
    options = EngineOptions(kv_bytes_per_token=KV_BYTES, layers=80, **opts)  # type: ignore[arg-type]
    sim = ServingSim(instances, requests, KVNetwork(None, nic_gbps=400.0), options)
    sim.outcome = sim.run()  # type: ignore[attr-defined]
    return sim


def test_colocated_mixes_a_prompt_into_the_decode_batch() -> None:
    reqs = [Request(0.0, 500, 3), Request(0.01, 500, 2)]
    out = _run([_inst(0, "both", 0)], reqs).outcome  # type: ignore[attr-defined]
    # A: prefill alone, 0 -> 50 ms. B waits; 50 ms -> mixed iteration of 500 + 1 tokens x 1.1
    mixed = 0.05 + 0.0501 * MIXED_FACTOR
    assert out.ttft[0] == pytest.approx(0.05)
    assert out.ttft[1] == pytest.approx(mixed - 0.01)
    # then one decode step of both (10 ms): A has made tokens 2 and 3, B token 2
    assert out.e2e[0] == pytest.approx(mixed + 0.01)
    assert out.e2e[1] == pytest.approx(mixed + 0.01 - 0.01)
    assert out.tbt[0] == pytest.approx((mixed + 0.01 - 0.05) / 2)


@pytest.mark.parametrize("mode", ["split-hh", "split-ha", "split-hhcap"])
def test_split_sends_the_kv_cache_before_decoding(mode: str) -> None:
    # the split modes differ by their profiles only; the same flat one here gives the same times
    reqs = [Request(0.0, 500, 3)]
    sim = _run([_inst(0, "prefill", 0), _inst(1, "decode", 1)], reqs)
    out = sim.outcome  # type: ignore[attr-defined]
    assert out.ttft[0] == pytest.approx(0.05)  # the prefill instance sends the first token
    # 500 MB at 400 Gb/s: 10 ms, then two decode steps of 10 ms
    assert out.e2e[0] == pytest.approx(0.05 + 0.01 + 0.02)
    assert sim.net.kv_bytes == 500 * KV_BYTES
    assert sim.inst[0].kv_used == 0 and sim.inst[1].kv_used == 0  # every hold released


def test_first_token_at_decode_puts_the_transfer_into_ttft() -> None:
    out = _run(
        [_inst(0, "prefill", 0), _inst(1, "decode", 1)], [Request(0.0, 500, 3)], first_token="decode"
    ).outcome  # type: ignore[attr-defined]
    assert out.ttft[0] == pytest.approx(0.06)
    assert out.e2e[0] == pytest.approx(0.08)


def test_layer_wise_overlap_hides_the_transfer_behind_the_prefill() -> None:
    out = _run([_inst(0, "prefill", 0), _inst(1, "decode", 1)], [Request(0.0, 500, 3)], overlap=True).outcome  # type: ignore[attr-defined]
    # the flow runs during the prefill (10 ms of its 50); the last layer (1/80) leaves after it
    assert out.e2e[0] == pytest.approx(0.05 + 0.01 / 80 + 0.02)


def test_jsq_sends_prompts_to_the_shortest_queue_and_decodes_to_the_most_free_memory() -> None:
    instances = [_inst(0, "prefill", 0), _inst(1, "prefill", 1), _inst(2, "decode", 2), _inst(3, "decode", 3)]
    instances[2].kv_capacity = 50_000
    reqs = [Request(0.0, 800, 2), Request(0.0, 500, 2), Request(0.0, 100, 2)]
    sim = _run(instances, reqs)
    assert [sim.decoder[r] for r in range(3)] == [3, 3, 3]  # instance 3 keeps the most free memory
    assert all(math.isfinite(x) for x in sim.outcome.e2e)  # type: ignore[attr-defined]


def test_the_fabric_router_keeps_the_kv_cache_off_a_loaded_link() -> None:
    instances = [_inst(0, "prefill", 0), _inst(1, "decode", 1), _inst(2, "decode", 2)]
    instances[2].kv_capacity = 200_000  # jsq would pick it: the most free memory
    net = KVNetwork(None, nic_gbps=400.0)
    net.start(0.0, 99, 5, 2, 1e12)  # a long flow already on node 2's link
    for router, expected in (("jsq", 2), ("fabric", 1)):
        sim = ServingSim(
            instances, [Request(0.0, 500, 2)], net, EngineOptions(router=router, kv_bytes_per_token=KV_BYTES)
        )
        assert sim._pick_decode(instances[0], sim.reqs[0]).index == expected


def test_idle_colocated_instances_share_the_prompts() -> None:
    # A runs on instance 0 from 0 to 50 ms; B arrives at 0.1 s when both queues are empty: it goes
    # to instance 1, which has no running request, and prefills at once (50 ms)
    out = _run(
        [_inst(0, "both", 0), _inst(1, "both", 1)], [Request(0.0, 500, 100), Request(0.1, 500, 2)]
    ).outcome  # type: ignore[attr-defined]
    assert out.ttft[1] == pytest.approx(0.05)


def test_fabric_weighs_every_decode_step_and_fabric_local_only_one() -> None:
    # decode 1 shares node 0's leaf-free path but already runs 10 requests (a 21 ms step against 11 ms);
    # decode 2 is idle behind a link another flow loads
    slow = StepProfile("m", "h100-80gb", 8, (0.0, 1000.0), (0.0, 100.0), (10.0, 1.0, 0.0, 0.0), 1.0)
    near, far = Instance(1, "decode", 1, slow, 100_000), Instance(2, "decode", 2, slow, 100_000)
    for r in range(10):
        near.running.append((1000, r))
    net = KVNetwork(None, nic_gbps=400.0)
    net.start(0.0, 99, 5, 2, 1e12)
    front = _inst(0, "prefill", 0)
    picks = {}
    for router in ("fabric", "fabric-local"):
        sim = ServingSim(
            [front, near, far],
            [Request(0.0, 500, 200)],
            net,
            EngineOptions(router=router, kv_bytes_per_token=KV_BYTES),
        )
        picks[router] = sim._pick_decode(front, sim.reqs[0]).index
    # near: 10 ms of transfer; far: 20 ms (half the link) + 10 ms the other flow loses.
    # fabric: 128 steps (no output seen yet) x 10 ms more on `near` outweigh those 20 ms;
    # fabric-local: one step, 10 + 21 ms against 30 + 11 ms: the near one

    assert picks == {"fabric": 2, "fabric-local": 1}


def test_mixed_pool_runs_a_prompt_on_a_decode_instance_when_the_prefill_queue_is_long() -> None:
    # A's 8,000-token prompt holds the only prefill instance for 0.8 s; B (500 tokens) would push
    # its queue past 8,192 tokens, so with Splitwise's mixed pool the idle decode instance prefills
    # B itself (50 ms) and decodes it there: no KV transfer for B
    reqs = [Request(0.0, 8000, 3), Request(0.01, 500, 3)]
    plain = _run([_inst(0, "prefill", 0), _inst(1, "decode", 1)], reqs)
    mixed = _run([_inst(0, "prefill", 0), _inst(1, "decode", 1)], reqs, mixed_pool=True)
    assert plain.outcome.ttft[1] == pytest.approx(0.8 + 0.05 - 0.01)  # type: ignore[attr-defined]
    assert mixed.outcome.ttft[1] == pytest.approx(0.05)  # type: ignore[attr-defined]
    assert mixed.borrowed == 1 and plain.borrowed == 0
    assert mixed.net.kv_bytes == 8000 * KV_BYTES  # only A's cache crossed
    assert mixed.outcome.ttft[0] == pytest.approx(0.8)  # type: ignore[attr-defined]
    assert all(i.kv_used == 0 and i.kv_reserved == 0 for i in mixed.inst)
    # a short queue keeps the split: B behind a 1,000-token prompt waits for the prefill instance
    short = _run(
        [_inst(0, "prefill", 0), _inst(1, "decode", 1)],
        [Request(0.0, 1000, 3), Request(0.01, 500, 3)],
        mixed_pool=True,
    )
    assert short.borrowed == 0


def test_the_kv_wait_is_the_transfer_after_the_prefill_and_nothing_where_nothing_moved() -> None:
    split = _run([_inst(0, "prefill", 0), _inst(1, "decode", 1)], [Request(0.0, 500, 3)]).outcome  # type: ignore[attr-defined]
    assert split.kv_wait[0] == pytest.approx(0.01)  # 500 MB at 400 Gb/s
    pair = [_inst(0, "prefill", 0), _inst(1, "decode", 1)]
    overlap = _run(pair, [Request(0.0, 500, 3)], overlap=True).outcome  # type: ignore[attr-defined]
    assert overlap.kv_wait[0] == pytest.approx(0.01 / 80)  # only the last layer is left after the prefill
    local = _run([_inst(0, "both", 0)], [Request(0.0, 500, 3)]).outcome  # type: ignore[attr-defined]
    assert math.isnan(local.kv_wait[0])


def test_the_ttft_tail_says_how_much_of_it_is_the_kv_transfer() -> None:
    import numpy as np

    from gpupool.sim.serving.engine import Outcome
    from gpupool.sim.serving.run import _kv_wait

    ttft = np.arange(1, 201, dtype=float) / 100  # 0.01 .. 2.00 s; the slowest 1 %: 1.99 and 2.00 s
    wait = np.full(200, 0.001)
    wait[-1], wait[-2], wait[0] = 0.5, math.nan, math.nan  # the slowest moved 0.5 s; one was local
    out = Outcome(ttft, ttft, ttft, 3.0, (1.0,), wait)
    got = _kv_wait(out)
    assert got["ttft_tail_s"] == pytest.approx((1.99 + 2.00) / 2)
    assert got["ttft_tail_kv_s"] == pytest.approx(0.5 / 2)  # the local one counts as no wait
    assert got["p50_s"] == pytest.approx(0.001)
