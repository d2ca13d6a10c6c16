"""Request traces for the serving simulation: Azure's LLM inference traces (2023) and plain lists."""

from __future__ import annotations

import csv
import datetime as dt
import random
from dataclasses import dataclass
from pathlib import Path

from gpupool.errors import InvalidInput
from gpupool.textfiles import text_stream

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
TRACE_KINDS = ("azure-code", "azure-conv")


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request: when it arrives (s from the trace's start) and its token counts."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def parse_trace_arg(text: str) -> tuple[str, Path]:
    """'azure-code:FILE' -> ('azure-code', FILE); raises InvalidInput naming the kinds."""
    kind, sep, path = text.partition(":")
    if not sep or kind not in TRACE_KINDS or not path:
        raise InvalidInput(
            f"--trace takes KIND:FILE with KIND one of {', '.join(TRACE_KINDS)}, "
            f"e.g. azure-conv:AzureLLMInferenceTrace_conv.csv; got {text!r}."
        )
    return kind, Path(path)


def _stamp(text: str) -> float:
    head, _, frac = text.strip().partition(".")
    base = dt.datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def _azure_rows(path: Path) -> list[tuple[float, int, int]]:
    """(epoch seconds, prompt tokens, output tokens) of every request of an Azure LLM trace, in time
    order; raises InvalidInput naming missing columns or a bad row."""
    try:
        with text_stream(path, "the request trace") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in AZURE_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise InvalidInput(
                    f"The trace {path.name} lacks the columns {', '.join(missing)}; an Azure "
                    f"LLM trace has {', '.join(AZURE_COLUMNS)}."
                )
            raw = []
            for n, row in enumerate(reader, start=2):
                try:
                    raw.append(
                        (_stamp(row["TIMESTAMP"]), int(row["ContextTokens"]), int(row["GeneratedTokens"]))
                    )
                except (ValueError, TypeError):
                    raise InvalidInput(
                        f"{path.name}:{n}: expected a time stamp and two token counts, got {row!r}."
                    ) from None
    except OSError as exc:
        raise InvalidInput(f"Cannot read the trace {path}: {exc.strerror}.") from None
    if not raw:
        raise InvalidInput(f"The trace {path.name} has no requests.")
    raw.sort()
    return raw


def azure_start_s(path: Path) -> float:
    """When an Azure LLM trace's first request arrived (epoch seconds, UTC): the time its run
    represents, which `load_azure`'s arrivals count from."""
    return _azure_rows(path)[0][0]


def load_azure(
    path: Path, rate_scale: float = 1.0, limit_s: float | None = None, poisson_seed: int | None = None
) -> list[Request]:
    """Requests of an Azure LLM trace (TIMESTAMP,ContextTokens,GeneratedTokens), arrivals from the
    first one, divided by `rate_scale` (2.0: twice the request rate); only the first `limit_s`
    seconds (after scaling) when given. With `poisson_seed`, the requests keep their order and token
    counts but arrive as a Poisson process at the trace's mean rate x `rate_scale` (what Splitwise's
    simulator replays: its traces are drawn at a request rate from these distributions), seeded.
    Raises InvalidInput naming missing columns or a bad row."""
    if rate_scale <= 0:
        raise InvalidInput(f"--rate-scale must be above 0 (1.0: the trace's own rate), got {rate_scale:g}.")
    raw = _azure_rows(path)
    t0 = raw[0][0]
    stamps = [stamp - t0 for stamp, _, _ in raw]
    if poisson_seed is not None:
        rng = random.Random(poisson_seed)
        mean_gap = (stamps[-1] / (len(raw) - 1)) if len(raw) > 1 else 1.0
        clock, stamps = 0.0, []
        for _ in raw:
            stamps.append(clock)
            clock += rng.expovariate(1.0 / mean_gap)
    out = []
    for (_, prompt, output), stamp in zip(raw, stamps, strict=True):
        at = stamp / rate_scale
        if limit_s is not None and at > limit_s:
            break
        out.append(Request(at, max(prompt, 1), max(output, 1)))
    return out
