"""Parse and format the units gpupool speaks: milli-CPU, MiB, milli-device."""

from __future__ import annotations

import re

from gpupool.errors import InvalidInput

MILLI = 1000
"""compute_milli of one whole device, cpu_milli of one core."""

_MEMORY_UNITS_MIB = {
    "": 1.0,
    "mi": 1.0,
    "mib": 1.0,
    "m": 1.0,
    "mb": 1e6 / 2**20,
    "gi": 1024.0,
    "gib": 1024.0,
    "g": 1024.0,
    "gb": 1e9 / 2**20,
    "ti": 1024.0**2,
    "tib": 1024.0**2,
    "t": 1024.0**2,
    "tb": 1e12 / 2**20,
    "ki": 1 / 1024,
    "kib": 1 / 1024,
}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_memory_mib(text: str | int | float) -> int:
    """'8GiB' -> 8192, '512Mi' -> 512, 1024 -> 1024 (a bare number is MiB)."""
    if isinstance(text, int | float):
        if text < 0:
            raise InvalidInput(f"Memory must not be negative, got {text}.")
        return int(text)
    match = _QUANTITY.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _MEMORY_UNITS_MIB:
        raise InvalidInput(
            f"Cannot read memory size {text!r}; write a number with a unit such as 512MiB, 8GiB or 1TiB."
        )
    return round(float(match.group(1)) * _MEMORY_UNITS_MIB[unit])


def parse_cpu_milli(text: str | int | float) -> int:
    """'4' -> 4000, '500m' -> 500, 0.5 -> 500."""
    if isinstance(text, int | float):
        value = float(text)
    else:
        raw = text.strip().lower()
        try:
            value = float(raw[:-1]) / MILLI if raw.endswith("m") else float(raw)
        except ValueError:
            raise InvalidInput(
                f"Cannot read CPU amount {text!r}; write cores (4, 0.5) or milli-cores (500m)."
            ) from None
    if value < 0:
        raise InvalidInput(f"CPU must not be negative, got {text!r}.")
    return round(value * MILLI)


def parse_devices(text: str | int | float) -> tuple[int, int]:
    """Device ask as (count, compute_milli per device): '0.25' -> (1, 250), '2' -> (2, 1000).

    A fraction is a slice of one device; more than one device must be a whole number.
    """
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise InvalidInput(
            f"Cannot read device count {text!r}; write a fraction below 1 (0.25) or a whole number (2)."
        ) from None
    if value <= 0:
        return (0, 0)
    if value < 1:
        milli = round(value * MILLI)
        if milli < 1:
            raise InvalidInput(f"A slice must be at least 0.001 of a device, got {text!r}.")
        return (1, milli)
    if value != int(value):
        raise InvalidInput(
            f"More than one device must be a whole number, got {text!r}; ask for 1, 2, 4... "
            "or for a single fraction below 1."
        )
    return (int(value), MILLI)


def format_memory_mib(mib: int) -> str:
    """8192 -> '8GiB', 1536 -> '1.5GiB', 300 -> '300MiB'."""
    if mib >= 1024 and mib % 1024 == 0:
        return f"{mib // 1024}GiB"
    if mib >= 1024:
        return f"{mib / 1024:.1f}GiB"
    return f"{mib}MiB"


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
_SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "ki": 2**10, "m": 2**20, "mib": 2**20, "mi": 2**20,
               "g": 2**30, "gib": 2**30, "gi": 2**30, "t": 2**40, "tib": 2**40, "ti": 2**40}


def size_bytes(text: str) -> int | None:
    """'1MiB' -> 1048576, '512k' -> 524288, '4096' -> 4096 (binary units; a bare number is bytes);
    None for anything else."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _SIZE_UNITS:
        return None
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_size_bytes(text: str, what: str) -> int:
    """size_bytes, or InvalidInput naming `what` (a flag or a variable)."""
    parsed = size_bytes(text)
    if parsed is None:
        raise InvalidInput(f"{what} must be a size such as 4096, 512KiB, 1MiB or 2GiB, not {text!r}.")
    return parsed
