"""Serving metrics: latency percentiles, slowdowns against an unloaded run, Splitwise's SLOs.

SLOs (Splitwise, ISCA'24, Table IV): the p50 / p90 / p99 of each request's slowdown, its latency
over the same request's latency alone on an unloaded reference instance (a DGX-A100 by default,
`ServeOptions.slo_reference`), must stay within
TTFT 2 / 3 / 6, TBT 1.25 / 1.5 / 5 and end-to-end 1.25 / 1.5 / 5. A run meets its SLOs when all
nine hold; its attainment is the share of the nine that hold. A request that never finished counts
as an infinite slowdown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpupool.sim.serving.profiles import StepProfile
from gpupool.sim.serving.trace import Request

SLO: dict[str, tuple[float, float, float]] = {
    "ttft": (2.0, 3.0, 6.0),
    "tbt": (1.25, 1.5, 5.0),
    "e2e": (1.25, 1.5, 5.0),
}
PERCENTILES = (50, 90, 99)


def unloaded(requests: Sequence[Request], ref: StepProfile) -> dict[str, np.ndarray]:
    """Each request alone on `ref`: TTFT = prefill(prompt), TBT = decode(1, mid context)."""
    prompt = np.array([r.prompt_tokens for r in requests], dtype=float)
    out = np.array([r.output_tokens for r in requests], dtype=float)
    ttft = np.array([ref.prefill_s(p) for p in prompt])
    tbt = np.array([ref.decode_s(1, p + o / 2) for p, o in zip(prompt, out, strict=True)])
    return {"ttft": ttft, "tbt": tbt, "e2e": ttft + np.maximum(out - 1, 0) * tbt}


def _pct(values: np.ndarray, q: float) -> float:
    finite = np.where(np.isnan(values), np.inf, values)
    return float(np.percentile(finite, q)) if len(finite) else math.nan


def latency_table(measured: dict[str, np.ndarray], base: dict[str, np.ndarray]) -> dict[str, Any]:
    """p50/p90/p99 of each latency (seconds) and of its slowdown, the SLO checks and attainment."""
    out: dict[str, Any] = {}
    held = 0
    for metric, limits in SLO.items():
        values = measured[metric]
        if metric == "tbt":  # one-token requests have no time between tokens
            keep = base["tbt"] > 0
            keep &= ~np.isclose(measured["tbt"], 0.0) | np.isnan(measured["tbt"])
            values, ref = values[keep], base[metric][keep]
        else:
            ref = base[metric]
        with np.errstate(invalid="ignore", divide="ignore"):
            slow = values / np.maximum(ref, 1e-9)
        row: dict[str, float | bool] = {}
        for q, limit in zip(PERCENTILES, limits, strict=True):
            row[f"p{q}_s"] = _pct(values, q)
            row[f"p{q}_slowdown"] = _pct(slow, q)
            ok = row[f"p{q}_slowdown"] <= limit
            row[f"p{q}_meets"] = bool(ok)
            held += int(ok)
        out[metric] = row
    out["slo_attainment"] = held / 9.0
    out["slo_met"] = held == 9
    return out
