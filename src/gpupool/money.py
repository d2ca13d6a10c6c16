"""Amounts of money as people read them: the currency's minor unit (cents for USD, none for JPY, fils
for BHD), or more digits where the minor unit would leave a small amount fewer than two significant
digits (0.005 USD, not 0.01; 0.0123 USD as 0.012). A bill's lines are rounded together, so that
they add up to its rounded total (`apportioned`).
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Decimal

ZERO_DECIMALS = frozenset({"BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX",
                           "UYI", "VND", "VUV", "XAF", "XOF", "XPF"})
THREE_DECIMALS = frozenset({"BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"})
EXTRA_DECIMALS = 4
"""How many digits past the minor unit an amount may show (beyond them it is rounded)."""


def minor_digits(currency: str | None) -> int:
    """Decimals of the currency's minor unit (ISO 4217); 2 for a currency not listed or unknown."""
    code = (currency or "").strip().upper()
    return 0 if code in ZERO_DECIMALS else 3 if code in THREE_DECIMALS else 2


def decimals(amount: float, currency: str | None = None) -> int:
    """How many decimals `money` rounds `amount` to: the minor unit's, or up to EXTRA_DECIMALS more
    for a small amount."""
    least = minor_digits(currency)
    digits = least
    while digits < least + EXTRA_DECIMALS and abs(amount) < 10.0 ** (1 - digits):
        digits += 1
    return digits


def money(amount: float, currency: str | None = None) -> str:
    """`amount` with the currency's minor unit, or as many more decimals (at most EXTRA_DECIMALS more)
    as give it two significant digits: 1.5 USD -> '1.50', 0.655 USD -> '0.66', 0.005 USD -> '0.005',
    1500 JPY -> '1500', 0.25 JPY -> '0.25'."""
    return _trimmed(f"{amount:.{decimals(amount, currency)}f}", minor_digits(currency))


def _trimmed(text: str, least: int) -> str:
    """`text` (a fixed-point number) without the zeros that end its fraction past `least` decimals."""
    if "." in text:
        whole, _, fraction = text.partition(".")
        fraction = fraction.rstrip("0").ljust(least, "0")
        text = f"{whole}.{fraction}" if fraction else whole
    return text[1:] if text.startswith("-") and not text.strip("-0.") else text  # never "-0.00"


def apportioned(lines: Sequence[float], total: float, digits: int) -> list[int]:
    """`lines` in units of 10**-digits, rounded so that they add up to `total` rounded (half to even,
    as a format rounds it): each line rounded down, then the units missing go one each to the lines
    that rounding cut most (largest remainder; the first of equal ones), or are taken from those
    it cut least. Three lines of 0.336 with a total of 1.008, to cents: 34, 34 and 33 (1.01)."""
    if not lines:
        return []
    exact = [Decimal(line).scaleb(digits) for line in lines]
    units = [int(x.to_integral_value(ROUND_FLOOR)) for x in exact]
    left = int(Decimal(total).scaleb(digits).to_integral_value(ROUND_HALF_EVEN)) - sum(units)
    cut = [x - u for x, u in zip(exact, units, strict=True)]
    order = sorted(range(len(lines)), key=lambda i: -cut[i]) if left > 0 else \
        sorted(range(len(lines)), key=lambda i: cut[i])
    step = 1 if left > 0 else -1
    for n in range(abs(left)):  # one unit a line; a line again only when every line had one
        units[order[n % len(order)]] += step
    return units


def fixed_units(units: int, digits: int, least: int | None = None) -> str:
    """`units` of 10**-digits as a decimal number with `digits` decimals, or with `least` given, less
    the zeros that end it past `least` decimals: 105, 3, 2 -> '0.105'; 100, 3, 2 -> '0.10'."""
    text = f"{'-' if units < 0 else ''}{abs(units) // 10 ** digits}"
    if digits:
        text += f".{abs(units) % 10 ** digits:0{digits}d}"
    return text if least is None else _trimmed(text, least)


def bill(lines: Sequence[float], total: float, currency: str | None = None) -> tuple[list[int], int, int]:
    """A bill's lines and total in units of 10**-digits, and those digits: the decimals `money` shows
    of the largest amount (the total's, unless lines cancel out), the lines rounded so that they add up
    to the total (`apportioned`). 0.336 USD three times with a total of 1.008: 34, 34, 33 and 101, 2:
    with `fixed_units`, 0.34, 0.34, 0.33 and 1.01, the total as `money` shows it."""
    digits = min(decimals(amount, currency) for amount in (total, *lines))
    whole = int(Decimal(total).scaleb(digits).to_integral_value(ROUND_HALF_EVEN))
    return apportioned(lines, total, digits), whole, digits
