"""Serving profiles: the fit of measured step times, its held-out error, outliers, KV bytes per token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpupool.errors import InvalidInput
from gpupool.sim.serving.profiles import MODELS, ProfileBook, held_out_error, instance_kv_tokens
from serving_factories import decode_ms, prefill_ms, write_profile


def test_llama2_70b_kv_cache_is_320_kib_a_token() -> None:
    # 80 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes
    arch = MODELS["llama2-70b"]
    assert arch.kv_bytes_per_token == 80 * 8 * 128 * 2 * 2 == 320 * 1024
    # a 1,500-token prompt's cache is about 480 MB, the figure the issue quotes
    assert 480e6 <= 1500 * arch.kv_bytes_per_token <= 500e6


def test_instance_memory_leaves_room_for_the_kv_cache_only_past_the_weights() -> None:
    arch = MODELS["llama2-70b"]
    gib80 = 80 * 2**30
    assert instance_kv_tokens(arch, gib80, 1) < 0  # 138 GB of weights do not fit one device
    tokens = instance_kv_tokens(arch, gib80, 8)
    assert tokens == int((8 * gib80 * 0.9 - arch.weight_bytes) // arch.kv_bytes_per_token)


def test_the_fit_reproduces_held_out_points_within_its_stated_error(tmp_path: Path) -> None:
    book = ProfileBook.from_csv(write_profile(tmp_path / "perf.csv"))
    key = ("llama2-70b", "h100-80gb", 8)
    err = held_out_error(book.points[key], *key)
    assert err.held_out >= 6
    # piecewise-linear prefill on a smooth curve: within 5 %; the decode form is the generator's own
    assert err.prefill_max < 0.05
    assert err.decode_max < 1e-6
    prof = book.get(*key)
    for tokens in (300, 3000, 20000):
        assert prof.prefill_s(tokens) * 1000 == pytest.approx(prefill_ms(tokens), rel=0.05)
    assert prof.decode_s(24, 24 * 900) * 1000 == pytest.approx(decode_ms(24, 24 * 900), rel=1e-6)


def test_an_out_of_line_point_is_listed_and_left_out(tmp_path: Path) -> None:
    clean = ProfileBook.from_csv(write_profile(tmp_path / "clean.csv")).get("llama2-70b", "h100-80gb", 8)
    spiked = ProfileBook.from_csv(write_profile(tmp_path / "spike.csv", spike_at=16)).get(
        "llama2-70b", "h100-80gb", 8)
    assert clean.outliers == ()
    assert spiked.outliers == ("prefill 512x16+prefill 8192x1",)
    # the spike does not bend the curve: 8192 tokens lie on the line between 4096 and 16384
    low, high = clean.prefill_s(4096), clean.prefill_s(16384)
    assert spiked.prefill_s(8192) == pytest.approx(low + (high - low) / 3, rel=1e-9)


def test_a_model_or_hardware_without_a_profile_names_those_available(tmp_path: Path) -> None:
    book = ProfileBook.from_csv(write_profile(tmp_path / "perf.csv", hardware=("h100-80gb",)))
    with pytest.raises(InvalidInput, match="profiles exist for: llama2-70b"):
        book.get("mistral-7b", "h100-80gb", 8)
    with pytest.raises(InvalidInput, match="this file has: h100-80gb tp8"):
        book.get("llama2-70b", "a100-80gb", 8)


def test_a_profile_file_without_the_columns_names_them(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("model,hardware,prompt_size\nllama2-70b,h100-80gb,512\n")
    with pytest.raises(InvalidInput, match="lacks the columns tensor_parallel, batch_size"):
        ProfileBook.from_csv(bad)


def test_a_collapsed_last_point_goes_alone_not_with_its_neighbour() -> None:
    # the tp2 pattern of the measured file: 512 x 64 at a tenth of 512 x 32's time
    from gpupool.sim.serving.profiles import _prefill_outliers

    xs = np.array([512.0, 1024, 2048, 4096, 8192, 16384, 32768])
    ys = np.array([prefill_ms(x) for x in xs])
    ys[-1] = ys[-2] / 8
    assert _prefill_outliers(xs, ys, np.zeros(len(xs))).tolist() == [False] * 6 + [True]


def test_past_the_largest_measured_batch_the_decode_step_follows_its_tangent_and_never_falls() -> None:
    from gpupool.sim.serving.profiles import StepProfile

    # a quadratic that bends down (as the A100 fit does: c < 0), measured up to batch 32
    prof = StepProfile("m", "a100-80gb", 8, (0.0, 1000.0), (0.0, 100.0), (44.0, 0.24, -0.0043, 0.0), 1.0,
                       decode_batch_max=32)
    at32 = prof.decode_s(32, 0.0)
    assert at32 * 1000 == pytest.approx(44.0 + 0.24 * 32 - 0.0043 * 32 * 32)
    # the tangent at 32 falls (0.24 - 2 x 0.0043 x 32 < 0): held flat, never down to the 1 ms floor
    assert prof.decode_s(256, 0.0) == pytest.approx(at32)
    rising = StepProfile("m", "h100-80gb", 8, (0.0, 1000.0), (0.0, 100.0), (30.0, 0.15, 0.001, 0.0), 1.0,
                         decode_batch_max=64)
    slope = 0.15 + 2 * 0.001 * 64
    assert rising.decode_s(512, 0.0) * 1000 == pytest.approx(30.0 + 0.15 * 64 + 0.001 * 64**2 + slope * 448)
    assert rising.decode_s(512, 0.0) < (30.0 + 0.15 * 512 + 0.001 * 512**2) / 1000  # not the quadratic


def test_a_fitted_profile_knows_its_largest_measured_batch(tmp_path: Path) -> None:
    book = ProfileBook.from_csv(write_profile(tmp_path / "perf.csv"))
    prof = book.get("llama2-70b", "h100-80gb", 8)
    assert prof.decode_batch_max == 64
    # inside the measured range the fit is the generator's own
    assert prof.decode_s(64, 64 * 600) * 1000 == pytest.approx(decode_ms(64, 64 * 600), rel=1e-6)
    slope = 0.2 + 2 * 0.002 * 64
    assert prof.decode_s(128, 0.0) * 1000 == pytest.approx(decode_ms(64, 0.0) + slope * 64, rel=1e-6)


def test_splitwise_lookup_reads_a_decode_batch_as_batch_tokens_not_the_batch_sweep(tmp_path: Path) -> None:
    from gpupool.providers.nodespec import nodes_from_spec
    from gpupool.sim.serving.run import Mode, ServeOptions, plan_instances

    book = ProfileBook.from_csv(write_profile(tmp_path / "perf.csv"))
    key = ("llama2-70b", "h100-80gb", 8)
    nodes = nodes_from_spec("2x8xH100")
    _, fitted = plan_instances(nodes, book, ServeOptions(mode=Mode.SPLIT_HH))
    _, looked = plan_instances(nodes, book, ServeOptions(mode=Mode.SPLIT_HH, decode_model="splitwise"))
    assert fitted[0].decode_by_tokens is None
    # 512 requests are 512 batch tokens: the median token time of the points of 512 tokens (batch 1,
    # prompt 512, outputs of 128-4,096 tokens), one request's step, not a batch of 512's
    one = sorted(decode_ms(1, 512 + t / 2) for t in (128, 256, 1024, 4096))
    assert looked[1].decode_s(512, 10**6) * 1000 == pytest.approx((one[1] + one[2]) / 2)
    assert fitted[1].decode_s(512, 512 * 600) > 3 * looked[1].decode_s(512, 512 * 600)
    # below the smallest batch-token point (128 tokens) the line through 128 and 256 goes on
    low = book.points[key]
    at = {p.prompt_size: p.token_ms for p in low if p.batch_size == 1 and p.token_size == 128}
    slope = (at[256] - at[128]) / 128
    assert looked[1].decode_s(64, 0) * 1000 == pytest.approx(at[128] - 64 * slope)
    with pytest.raises(InvalidInput, match="use fit or splitwise"):
        plan_instances(nodes, book, ServeOptions(mode=Mode.SPLIT_HH, decode_model="flat"))
