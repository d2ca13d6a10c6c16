"""Step-time profiles of LLM instances: measured prefill and decode times, checked and fitted.

The measurements (Splitwise's `perf_model.csv` columns: model, hardware, tensor_parallel,
prompt_size, batch_size, token_size, prompt_time, token_time in ms, peak_power as a fraction of the
device's rated power) are reduced to the median of their repetitions, then fitted per
(model, hardware, tensor parallelism):

- prefill: piecewise linear in T, the batch's prompt tokens (prompt_size x batch_size), through the
  medians at each measured T, extended linearly past both ends (the curve bends at 2-4k tokens,
  where a low-order polynomial misses by 15-40 %);
- decode step: t_ms = a + b*B + c*B^2 + d*K, B the batch size, K the context tokens the step reads
  (B x (prompt_size + token_size / 2)), d >= 0; past the largest batch the fit kept, a + b*B + c*B^2
  goes on along its tangent there, never falling (`StepProfile.decode_batch_max`).

The decode fit is least squares on relative error (each row divided by its measured time).
Outliers are listed and left out: a prefill point whose repetitions spread by more than
`SPREAD_REL` (max-min over median), that is out of order with its neighbours or far from the line
between them (`_prefill_outliers`); a decode row
that the fit of the other rows (leave-one-out) misses by more than `OUTLIER_REL`.
`held_out_error` fits without every other interior point and reports the error on those.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpupool.errors import InvalidInput
from gpupool.textfiles import text_stream

PERF_COLUMNS = (
    "model",
    "hardware",
    "tensor_parallel",
    "prompt_size",
    "batch_size",
    "token_size",
    "prompt_time",
    "token_time",
)
OUTLIER_REL = 0.25
SPREAD_REL = 0.30
ORDER_TOLERANCE = 0.15
NEIGHBOUR_REL = 0.40
"""A prefill point further than this from the straight line between its neighbours is out of line
(the measured curves bend by at most 26 % between doubling neighbours)."""
"""Below a few hundred tokens a prefill is a fixed cost (50-60 ms on H100 x8) and the medians wander
by about 10 % in either direction: not out of order."""

RATED_POWER_W = {"a100-80gb": 400.0, "h100-80gb": 700.0, "h100-80gb-pcap": 700.0}
"""SXM boards' rated power; a capped H100 is rated as an H100 (its profile's power fractions say
how much of it the cap leaves)."""

DEVICE_OF_HARDWARE = {
    "a100-80gb": "A100-80GB",
    "h100-80gb": "H100-SXM-80GB",
    "h100-80gb-pcap": "H100-SXM-80GB",
}
"""The pool's device model (profiles/*.yaml) each profiled hardware runs on."""


@dataclass(frozen=True, slots=True)
class ModelArch:
    """What the simulator needs of a model's architecture: weights and the KV cache's shape."""

    name: str
    params_b: float
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of every layer: layers x KV heads x head dim x 2 (K and V) x bytes."""
        return self.layers * self.kv_heads * self.head_dim * 2 * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.dtype_bytes


MODELS: dict[str, ModelArch] = {
    "llama2-70b": ModelArch("llama2-70b", 69.0, 80, 8, 128),
    "bloom-176b": ModelArch("bloom-176b", 176.0, 70, 112, 128),
}


@dataclass(frozen=True, slots=True)
class PerfPoint:
    """The median of one measured configuration's repetitions."""

    prompt_size: int
    batch_size: int
    token_size: int
    prompt_ms: float
    token_ms: float
    prompt_spread: float
    peak_power: float


@dataclass(frozen=True, slots=True)
class StepProfile:
    """Fitted step times of one (model, hardware, tensor parallelism)."""

    model: str
    hardware: str
    tp: int
    prefill_tokens: tuple[float, ...]
    prefill_ms: tuple[float, ...]
    """The prefill fit: piecewise linear through these (batch tokens, ms) medians, extended linearly."""
    decode: tuple[float, float, float, float]
    peak_power: float
    """Median measured peak power as a fraction of rated (1.0 where the file records none)."""
    outliers: tuple[str, ...] = ()
    decode_batch_max: int = 0
    """The largest measured decode batch (0: no bound). Past it the decode fit is extended along its
    tangent there, never falling: the quadratic term, fitted on batches of 1-64, bends the A100 curve
    down past 64 (to 1 ms at 256) and the H100 one up (476 ms at 512)."""

    decode_by_tokens: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    """Splitwise's simulator's decode lookup instead of the fit (`splitwise_decode_lookup`): a
    decode step of B requests takes the measured token time at B batch tokens, whatever the context."""

    def prefill_s(self, tokens: float) -> float:
        ms = _interp(np.asarray(self.prefill_tokens), np.asarray(self.prefill_ms), tokens)
        return max(ms, 1.0) / 1000.0

    def decode_s(self, batch: int, context_tokens: float) -> float:
        if self.decode_by_tokens is not None:
            xs, ys = self.decode_by_tokens
            return max(_interp(np.asarray(xs), np.asarray(ys), batch), 1.0) / 1000.0
        a, b, c, d = self.decode
        top = self.decode_batch_max
        if 0 < top < batch:
            at_top = a + b * top + c * top * top
            ms = at_top + max(b + 2 * c * top, 0.0) * (batch - top) + d * context_tokens
        else:
            ms = a + b * batch + c * batch * batch + d * context_tokens
        return max(ms, 1.0) / 1000.0

    @property
    def power_w(self) -> float:
        return self.tp * RATED_POWER_W.get(self.hardware, 700.0) * self.peak_power


def splitwise_decode_lookup(points: Iterable[PerfPoint]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Splitwise's simulator's decode curve: the median token time of the points at each batch token
    count (prompt size x batch size), piecewise linear, extended past both ends. It reads a decode
    batch of B requests as B batch tokens, so it meets the prompt sweep's points (batch 1, 128-8,192
    tokens: one request's step at that context) and not the batch sweep's (512 x B): on Llama-2-70B
    H100 x8 a step of 512 requests costs 30 ms, as much as one request's."""
    by: dict[int, list[float]] = defaultdict(list)
    for p in points:
        by[p.prompt_size * p.batch_size].append(p.token_ms)
    xs = sorted(by)
    return tuple(float(x) for x in xs), tuple(float(np.median(by[x])) for x in xs)


def read_perf_csv(path: Path) -> dict[tuple[str, str, int], list[PerfPoint]]:
    """Rows of a profile file grouped by (model, hardware, tp), repetitions reduced to medians.
    Raises InvalidInput naming the missing columns."""
    try:
        with text_stream(path, "the profile file") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in PERF_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise InvalidInput(
                    f"The profile file {path.name} lacks the columns {', '.join(missing)}; "
                    f"it needs {', '.join(PERF_COLUMNS)}."
                )
            rows = list(reader)
    except OSError as exc:
        raise InvalidInput(f"Cannot read the profile file {path}: {exc.strerror}.") from None
    reps: dict[tuple[str, str, int, int, int, int], list[tuple[float, float, float]]] = defaultdict(list)
    for n, row in enumerate(rows, start=2):
        try:
            key = (
                row["model"],
                row["hardware"],
                int(row["tensor_parallel"]),
                int(row["prompt_size"]),
                int(row["batch_size"]),
                int(row["token_size"]),
            )
            reps[key].append(
                (float(row["prompt_time"]), float(row["token_time"]), float(row.get("peak_power") or 0.0))
            )
        except (ValueError, TypeError):  # TypeError: a row cut short (csv gives None for its missing cells)
            raise InvalidInput(f"{path.name}:{n}: a number column does not hold a number (or the row is "
                               f"cut short: it needs {', '.join(PERF_COLUMNS)}).") from None
    out: dict[tuple[str, str, int], list[PerfPoint]] = defaultdict(list)
    for key, values in sorted(reps.items()):
        prompt = [v[0] for v in values]
        med = float(np.median(prompt))
        spread = (max(prompt) - min(prompt)) / med if med > 0 else 0.0
        out[key[:3]].append(
            PerfPoint(
                key[3],
                key[4],
                key[5],
                med,
                float(np.median([v[1] for v in values])),
                spread,
                float(np.median([v[2] for v in values])),
            )
        )
    return dict(out)


def _prefill_rows(points: Iterable[PerfPoint]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(batch tokens, median ms, label) per distinct batch-token count: the median over the
    configurations of that count (a 512x16 batch and one 8192-token prompt are both 8192 tokens),
    points of the token_size sweep (which repeat the 512-token prompt) counted once."""
    by_tokens: dict[int, list[tuple[float, str]]] = defaultdict(list)
    first = min((p.token_size for p in points), default=0)
    for p in points:
        if p.token_size == first or p.batch_size > 1:
            label = f"prefill {p.prompt_size}x{p.batch_size}"
            by_tokens[p.prompt_size * p.batch_size].append((p.prompt_ms, label))
    xs, ys, labels = [], [], []
    for tokens, vals in sorted(by_tokens.items()):
        xs.append(float(tokens))
        ys.append(float(np.median([v[0] for v in vals])))
        labels.append("+".join(v[1] for v in vals))
    return np.asarray(xs), np.asarray(ys), labels


def _offence(xs: np.ndarray, ys: np.ndarray, i: int) -> float:
    """How far point i of (xs, ys) is out of line (0: not at all): out of order with both
    neighbours by more than ORDER_TOLERANCE (a spike or a dip; at an end, with its one neighbour:
    a last point that drops, a first one above the second), or, inside, further than NEIGHBOUR_REL
    from the line between its neighbours."""
    n, tol = len(ys), 1.0 + ORDER_TOLERANCE
    if n < 2:
        return 0.0
    if i == 0:
        return ys[0] / ys[1] - 1.0 if ys[0] > ys[1] * tol else 0.0
    if i == n - 1:
        return ys[i - 1] / ys[i] - 1.0 if ys[i] * tol < ys[i - 1] else 0.0
    prev, nxt = ys[i - 1], ys[i + 1]
    worst = 0.0
    if (ys[i] > prev * tol and ys[i] > nxt * tol) or (ys[i] * tol < prev and ys[i] * tol < nxt):
        worst = min(abs(ys[i] / prev - 1.0), abs(ys[i] / nxt - 1.0))
    share = (xs[i] - xs[i - 1]) / (xs[i + 1] - xs[i - 1])
    off = abs(ys[i] / (prev + share * (nxt - prev)) - 1.0)
    return max(worst, off if off > NEIGHBOUR_REL else 0.0)


def _prefill_outliers(xs: np.ndarray, ys: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """Points whose repetitions spread by more than SPREAD_REL, then, one at a time and worst
    first, points out of line with their remaining neighbours (`_offence`): a wild point is taken
    out before it can make its neighbours look wild."""
    bad = spread > SPREAD_REL
    while True:
        keep = np.flatnonzero(~bad)
        scores = [_offence(xs[keep], ys[keep], j) for j in range(len(keep))]
        if not scores or max(scores) <= 0.0:
            return bad
        bad[keep[int(np.argmax(scores))]] = True


def _decode_rows(points: Iterable[PerfPoint]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    feats, ys, labels = [], [], []
    for p in points:
        context = p.batch_size * (p.prompt_size + p.token_size / 2)
        feats.append((1.0, p.batch_size, p.batch_size**2, context))
        ys.append(p.token_ms)
        labels.append(f"decode {p.prompt_size}x{p.batch_size}+{p.token_size}")
    return np.asarray(feats, dtype=float), np.asarray(ys), labels


def _lstsq_rel(design: np.ndarray, ys: np.ndarray, nonneg_last: bool = False) -> np.ndarray:
    """Least squares on relative error; with `nonneg_last`, the last coefficient is held >= 0."""
    w = 1.0 / np.maximum(ys, 1e-9)
    coef, *_ = np.linalg.lstsq(design * w[:, None], ys * w, rcond=None)
    if nonneg_last and coef[-1] < 0:
        sub, *_ = np.linalg.lstsq(design[:, :-1] * w[:, None], ys * w, rcond=None)
        coef = np.append(sub, 0.0)
    return coef


def _decode_outliers(design: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Rows whose leave-one-out prediction misses by more than OUTLIER_REL."""
    bad = np.zeros(len(ys), dtype=bool)
    if len(ys) <= design.shape[1] + 1:
        return bad
    for i in range(len(ys)):
        keep = np.arange(len(ys)) != i
        coef = _lstsq_rel(design[keep], ys[keep], nonneg_last=True)
        bad[i] = abs(float(design[i] @ coef) - ys[i]) / ys[i] > OUTLIER_REL
    return bad


def _interp(xs: np.ndarray, ys: np.ndarray, x: float) -> float:
    """Piecewise linear through (xs, ys), extended linearly past both ends."""
    if len(xs) == 1:
        return float(ys[0])
    i = int(np.clip(np.searchsorted(xs, x) - 1, 0, len(xs) - 2))
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
    return float(ys[i] + slope * (x - xs[i]))


@dataclass(frozen=True, slots=True)
class FitError:
    """Mean and max relative error of a fit on points it was not fitted on."""

    prefill_mean: float
    prefill_max: float
    decode_mean: float
    decode_max: float
    held_out: int


def _prefill_points(points: Sequence[PerfPoint]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    xs, ys, labels = _prefill_rows(points)
    spread_of: dict[int, float] = defaultdict(float)
    first = min((p.token_size for p in points), default=0)
    for p in points:
        if p.token_size == first or p.batch_size > 1:
            tokens = p.prompt_size * p.batch_size
            spread_of[tokens] = max(spread_of[tokens], p.prompt_spread)
    spread = np.asarray([spread_of[int(x)] for x in xs])
    return xs, ys, _prefill_outliers(xs, ys, spread), labels


def fit_profile(points: Sequence[PerfPoint], model: str, hardware: str, tp: int) -> StepProfile:
    """The fitted profile of one (model, hardware, tp) from its medians (outliers left out)."""
    xs, ys, pbad, plabels = _prefill_points(points)
    dd, dy, dlabels = _decode_rows(points)
    dbad = _decode_outliers(dd, dy)
    dcoef = _lstsq_rel(dd[~dbad], dy[~dbad], nonneg_last=True)
    powers = [p.peak_power for p in points if p.peak_power > 0]
    outliers = tuple(lab for lab, b in zip(plabels, pbad, strict=True) if b) + tuple(
        lab for lab, b in zip(dlabels, dbad, strict=True) if b
    )
    return StepProfile(
        model,
        hardware,
        tp,
        tuple(xs[~pbad].tolist()),
        tuple(ys[~pbad].tolist()),
        (float(dcoef[0]), float(dcoef[1]), float(dcoef[2]), float(dcoef[3])),
        float(np.median(powers)) if powers else 1.0,
        outliers,
        int(dd[~dbad, 1].max()) if (~dbad).any() else 0,
    )


def held_out_error(points: Sequence[PerfPoint], model: str, hardware: str, tp: int) -> FitError:
    """Fit without every other interior point (by prefill tokens and by decode rows) and measure the
    relative error on those held-back points (outliers excluded from both sides)."""
    xs, ys, pbad, _ = _prefill_points(points)
    px, py = xs[~pbad], ys[~pbad]
    phold = set(range(1, len(px) - 1, 2))
    ptrain = [i for i in range(len(px)) if i not in phold]
    perr = [abs(_interp(px[ptrain], py[ptrain], px[i]) - py[i]) / py[i] for i in sorted(phold)]
    dd, dy, _ = _decode_rows(points)
    didx = [int(i) for i in np.flatnonzero(~_decode_outliers(dd, dy))]
    dhold = set(didx[1:-1:2])
    dtrain = [i for i in didx if i not in dhold]
    dcoef = _lstsq_rel(dd[dtrain], dy[dtrain], nonneg_last=True)
    derr = [abs(float(dd[i] @ dcoef) - dy[i]) / dy[i] for i in sorted(dhold)]
    return FitError(
        float(np.mean(perr)) if perr else 0.0,
        max(perr, default=0.0),
        float(np.mean(derr)) if derr else 0.0,
        max(derr, default=0.0),
        len(perr) + len(derr),
    )


class ProfileBook:
    """Fitted profiles by (model, hardware, tp), read from a profile file."""

    def __init__(self, points: dict[tuple[str, str, int], list[PerfPoint]]) -> None:
        self.points = points
        self.profiles = {key: fit_profile(pts, *key) for key, pts in points.items()}

    @classmethod
    def from_csv(cls, path: Path) -> ProfileBook:
        return cls(read_perf_csv(path))

    def models(self) -> list[str]:
        return sorted({k[0] for k in self.profiles})

    def hardware(self, model: str) -> list[str]:
        return sorted({k[1] for k in self.profiles if k[0] == model})

    def get(self, model: str, hardware: str, tp: int) -> StepProfile:
        """The profile; raises InvalidInput naming what is available."""
        if model not in MODELS or model not in self.models():
            known = ", ".join(m for m in self.models() if m in MODELS) or "none"
            raise InvalidInput(f"No profile for the model {model!r}; profiles exist for: {known}.")
        found = self.profiles.get((model, hardware, tp))
        if found is None:
            have = ", ".join(f"{h} tp{t}" for (m, h, t) in sorted(self.profiles) if m == model)
            raise InvalidInput(
                f"No profile for {model} on {hardware} with tensor parallelism {tp}; this file has: {have}."
            )
        return found


def instance_kv_tokens(arch: ModelArch, device_memory_bytes: float, tp: int, mem_util: float = 0.9) -> int:
    """KV-cache tokens an instance of `tp` devices holds next to its weights (<= 0: weights don't fit)."""
    free = tp * device_memory_bytes * mem_util - arch.weight_bytes
    return math.floor(free / arch.kv_bytes_per_token)
