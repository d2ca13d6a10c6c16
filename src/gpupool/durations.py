"""Time limits as people type them (Slurm's --time forms and unit suffixes), for the CLI and the SDK.

Imports nothing: `gpupool submit` (cli/submit_fast.py) parses with it on its hot path.
"""

from __future__ import annotations

_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> float:
    """Seconds in a time limit: 90s, 30m, 2h, 1.5d, or Slurm's M:S, H:M:S, D-H, D-H:M, D-H:M:S.
    A bare number is refused (ValueError): Slurm reads minutes, the API seconds."""
    text = text.strip().lower()
    if len(text) > 1 and text[-1] in _UNIT_S and _is_number(text[:-1]):
        return float(text[:-1]) * _UNIT_S[text[-1]]
    days, dash, clock = text.rpartition("-")
    parts = clock.split(":")
    if not all(p.isascii() and p.isdigit() for p in [*parts, *([days] if dash else [])]):
        raise ValueError(text)
    numbers = [int(p) for p in parts]
    if dash:  # days-hours[:minutes[:seconds]]
        if len(numbers) > 3:
            raise ValueError(text)
        numbers += [0] * (3 - len(numbers))
        return int(days) * 86400.0 + numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    if len(numbers) == 2:  # minutes:seconds
        return numbers[0] * 60.0 + numbers[1]
    if len(numbers) == 3:  # hours:minutes:seconds
        return numbers[0] * 3600.0 + numbers[1] * 60 + numbers[2]
    raise ValueError(text)  # a bare number: minutes to Slurm, seconds elsewhere


def _is_number(text: str) -> bool:
    whole, _, fraction = text.partition(".")
    digits = all(p == "" or (p.isascii() and p.isdigit()) for p in (whole, fraction))
    return digits and bool(whole or fraction)
