"""Amounts of money as people read them: the currency's minor unit (cents for USD, none for JPY, fils
for BHD), or more digits where the minor unit would leave a small amount fewer than two significant
digits (0.005 USD, not 0.01; 0.0123 USD as 0.012).
"""

from __future__ import annotations

ZERO_DECIMALS = frozenset({"BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX",
                           "UYI", "VND", "VUV", "XAF", "XOF", "XPF"})
THREE_DECIMALS = frozenset({"BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"})
EXTRA_DECIMALS = 4
"""How many digits past the minor unit an amount may show (beyond them it is rounded)."""


def minor_digits(currency: str | None) -> int:
    """Decimals of the currency's minor unit (ISO 4217); 2 for a currency not listed or unknown."""
    code = (currency or "").strip().upper()
    return 0 if code in ZERO_DECIMALS else 3 if code in THREE_DECIMALS else 2


def money(amount: float, currency: str | None = None) -> str:
    """`amount` with the currency's minor unit, or as many more decimals (at most EXTRA_DECIMALS more)
    as give it two significant digits: 1.5 USD -> '1.50', 0.655 USD -> '0.66', 0.005 USD -> '0.005',
    1500 JPY -> '1500', 0.25 JPY -> '0.25'."""
    least = minor_digits(currency)
    digits = least
    while digits < least + EXTRA_DECIMALS and abs(amount) < 10.0 ** (1 - digits):
        digits += 1
    text = f"{amount:.{digits}f}"
    if "." in text:
        whole, _, fraction = text.partition(".")
        fraction = fraction.rstrip("0").ljust(least, "0")
        text = f"{whole}.{fraction}" if fraction else whole
    return text[1:] if text.startswith("-") and not text.strip("-0.") else text  # never "-0.00"
