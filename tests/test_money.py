"""Money in the currency's minor unit, or more where that would round a small amount away."""

from __future__ import annotations

import pytest

from gpupool.money import minor_digits, money


@pytest.mark.parametrize(("amount", "currency", "shown"), [
    (1.5, "USD", "1.50"),            # the minor unit: cents
    (12.3456789, "EUR", "12.35"),
    (0.005, "USD", "0.005"),         # not 0.01: the minor unit would double it
    (0.0123, "usd", "0.012"),        # two significant digits, any case of the code
    (0.655522, "USD", "0.66"),
    (0.0000001, "USD", "0.00"),      # past EXTRA_DECIMALS more digits it is zero
    (1500.0, "JPY", "1500"),         # no minor unit
    (1499.6, "JPY", "1500"),
    (0.25, "JPY", "0.25"),           # a fraction of a yen is still not shown as 0
    (1.2, "BHD", "1.200"),           # fils: three decimals
    (0.0, "USD", "0.00"),
    (-0.0, "JPY", "0"),              # never "-0"
    (-0.0000001, "USD", "0.00"),
    (-2.5, "USD", "-2.50"),
    (3.0, None, "3.00"),             # a currency not known: two decimals
])
def test_money_shows_the_minor_unit_or_more(amount: float, currency: str | None, shown: str) -> None:
    assert money(amount, currency) == shown


def test_minor_digits_follow_iso_4217() -> None:
    assert [minor_digits(c) for c in ("USD", "JPY", "KRW", "KWD", "XYZ", "")] == [2, 0, 0, 3, 2, 2]
