"""The price book section of the pool configuration (`prices:`), validated, and the core PriceBook it builds.

docs/configuration.md documents every key; `gpupool sim replay --prices FILE` reads the same
section (a whole pool configuration, or a file holding only `prices:`).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpupool.core.metering import PriceBook, PriceVersion, SliceShare, Tier, price_key
from gpupool.errors import InvalidInput
from gpupool.yamlfiles import read_text, safe_load

_CLOCK = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TierConfig(_Strict):
    """A time-of-day window (UTC) whose hours cost `multiplier` times the price."""

    start: str = Field(description="HH:MM, UTC")
    end: str = Field(description="HH:MM, UTC; at or before start: the window runs past midnight")
    multiplier: float = Field(gt=0, le=100)

    @field_validator("start", "end")
    @classmethod
    def _clock(cls, value: str) -> str:
        if not _CLOCK.match(value):
            raise ValueError(f"a time of day is HH:MM (00:00 to 23:59), not {value!r}")
        return value


def _seconds_of_day(clock: str) -> float:
    hours, minutes = clock.split(":")
    return int(hours) * 3600.0 + int(minutes) * 60.0


class PriceVersionConfig(_Strict):
    """One version of the price book, in force from `effective_from` (UTC midnight) to the next one's."""

    effective_from: dt.date = dt.date(1970, 1, 1)
    devices: dict[str, float] = Field(default_factory=dict)
    """Price per whole-device hour by model (or alias); a model not named takes its profile's
    reference `price_usd_per_hour`."""
    other_devices: float | None = Field(None, ge=0, allow_inf_nan=False)
    """For a model with neither an entry nor a reference price; null: its usage costs 0 (marked)."""
    slice_share: SliceShare = SliceShare.DOMINANT
    compute_weight: float = Field(0.5, ge=0, le=1)
    """Under slice_share: weighted, the compute share's weight (the memory share's is 1 - it)."""
    priority_classes: dict[str, float] = Field(default_factory=dict)
    """Multiplier by priority class (a class not named: 1), e.g. {critical: 1.5, best-effort: 0.5}."""
    tiers: list[TierConfig] = Field(default_factory=list)

    @field_validator("devices", "priority_classes")
    @classmethod
    def _non_negative(cls, value: dict[str, float]) -> dict[str, float]:
        bad = sorted(name for name, price in value.items() if not (math.isfinite(price) and price >= 0))
        if bad:
            raise ValueError(f"prices and multipliers are numbers of at least 0, not negative, infinite or "
                             f"nan ({', '.join(bad)})")
        return value

    @field_validator("tiers")
    @classmethod
    def _apart(cls, value: list[TierConfig]) -> list[TierConfig]:
        """A time of day takes one tier's multiplier: two windows that overlap are refused (their
        multipliers would add up, a discount past 100 % making a negative price)."""
        for i, one in enumerate(value):
            for other in value[i + 1:]:
                shared = _overlap(one, other)
                if shared:
                    raise ValueError(
                        f"tiers {one.start}-{one.end} and {other.start}-{other.end} overlap ({shared}); a "
                        "time of day takes one tier's multiplier, so split the windows where they meet")
        return value


def _minutes(tier: TierConfig) -> list[tuple[int, int]]:
    """The tier's window as [start, end) minutes of the day, cut at midnight (start == end: all day)."""
    start, end = (int(_seconds_of_day(t) // 60) for t in (tier.start, tier.end))
    if start < end:
        return [(start, end)]
    return [(start, 1440), (0, end)] if end else [(start, 1440)]


def _overlap(one: TierConfig, other: TierConfig) -> str:
    """Where two tiers' windows overlap, as HH:MM-HH:MM ('' when they do not)."""
    for a0, a1 in _minutes(one):
        for b0, b1 in _minutes(other):
            low, high = max(a0, b0), min(a1, b1)
            if low < high:
                return f"{low // 60:02d}:{low % 60:02d}-{high // 60 % 24:02d}:{high % 60:02d}"
    return ""


class PricesConfig(_Strict):
    """The price book: its currency and versions (oldest first; before the first, the first applies)."""

    currency: str = Field("USD", min_length=1, max_length=8)
    versions: list[PriceVersionConfig] = Field(
        default_factory=lambda: [PriceVersionConfig.model_validate({})], min_length=1)

    @field_validator("versions")
    @classmethod
    def _ordered(cls, value: list[PriceVersionConfig]) -> list[PriceVersionConfig]:
        dates = [v.effective_from for v in value]
        if dates != sorted(set(dates)):
            raise ValueError("price versions must be listed oldest first, each with its own effective_from")
        return value

    def price_book(self) -> PriceBook:
        """The core's PriceBook: each version's prices over the version before it (the first's over
        the profiles' reference prices, which are in US dollars: a book in another currency starts
        from none, so a model it does not name is `other_devices` or unpriced, never dollars)."""
        before = _reference_prices() if self.currency.upper() == "USD" else {}
        versions = []
        for v in self.versions:
            prices = dict(before)
            named = {price_key(model): price for model, price in v.devices.items()}
            for model, price in v.devices.items():  # the profile's other names: its first listed name's price
                aliases = [key for key in _names(model) if key not in named]
                prices.update(dict.fromkeys(aliases, price))
                named.update(dict.fromkeys(aliases, price))
            prices.update(named)  # a name listed keeps its own price, whatever its aliases were given
            before = prices
            start = dt.datetime.combine(v.effective_from, dt.time(), dt.UTC).timestamp()
            tiers = tuple(Tier(_seconds_of_day(t.start), _seconds_of_day(t.end), t.multiplier)
                          for t in v.tiers)
            versions.append(PriceVersion(start, prices, v.other_devices, dict(v.priority_classes), tiers,
                                         v.slice_share, v.compute_weight))
        return PriceBook(tuple(versions), self.currency)


def _names(model: str) -> list[str]:
    """price_key of the model and of every alias of its profile (just the model's when unknown)."""
    from gpupool.profiles.loader import find_profile

    profile = find_profile(model)
    return [price_key(model)] + ([price_key(n) for n in profile.names()] if profile is not None else [])


def _reference_prices() -> dict[str, float]:
    """price_key(name or alias) -> the profile's reference price, for every profile that has one."""
    from gpupool.profiles.loader import default_profiles

    prices: dict[str, float] = {}
    for profile in default_profiles().values():
        if profile.price_usd_per_hour is not None:
            for name in profile.names():
                prices[price_key(name)] = profile.price_usd_per_hour
    return prices


def load_prices(path: Path | str) -> PricesConfig:
    """A price book file: a pool configuration (its `prices:` section) or the section alone."""
    source = Path(path)
    try:
        data: Any = safe_load(read_text(source, "the price book"))
    except OSError as exc:
        raise InvalidInput(f"Cannot read the price book {source}: {exc.strerror}; check the path.") from exc
    except yaml.YAMLError as exc:
        raise InvalidInput(f"The price book {source} is not valid YAML: {str(exc).splitlines()[0]}.") from exc
    if isinstance(data, dict) and "prices" in data:
        data = data["prices"]
    try:
        return PricesConfig.model_validate(data or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise InvalidInput(f"The price book {source} is invalid at {where}: {first['msg']}.") from exc
