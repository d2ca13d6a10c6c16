"""Money in the currency's minor unit, or more where that would round a small amount away; a bill's
lines rounded together so that they add up to its total."""

from __future__ import annotations

import random

import pytest

from gpupool.money import apportioned, bill, fixed_units, minor_digits, money


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


@pytest.mark.parametrize(("lines", "total", "currency", "shown"), [
    ([0.336] * 3, 1.008, "USD", (["0.34", "0.34", "0.33"], "1.01")),  # not 0.34 three times (1.02)
    ([1004.4] * 3, 3013.2, "JPY", (["1005", "1004", "1004"], "3013")),  # not 1004 three times (3012)
    ([0.1004] * 3, 0.3012, "BHD", (["0.101", "0.100", "0.100"], "0.301")),
    ([0.001, 0.0015], 0.0025, "USD", (["0.001", "0.0015"], "0.0025")),  # a small total keeps its digits
    ([0.125], 0.125, "USD", (["0.12"], "0.12")),  # a tie to the even cent, as money() rounds it
    ([], 0.0, "USD", ([], "0.00")),
])
def test_a_bills_lines_add_up_to_its_total(lines: list[float], total: float, currency: str,
                                           shown: tuple[list[str], str]) -> None:
    units, whole, digits = bill(lines, total, currency)
    least = minor_digits(currency)
    assert ([fixed_units(u, digits, least) for u in units], fixed_units(whole, digits, least)) == shown
    assert sum(units) == whole


def test_apportioning_takes_units_back_and_hands_out_more_than_one_a_line() -> None:
    assert apportioned([1.0, 1.0], 1.4, 0) == [0, 1]  # lines above the total: one taken from the first
    assert apportioned([0.4, 0.4], 3.0, 0) == [2, 1]  # three units missing over two lines
    assert apportioned([0.25, 0.75, 0.5], 1.5, 0) == [0, 1, 1]  # the largest remainders first
    assert apportioned([-0.336] * 3, -1.008, 2) == [-33, -34, -34]  # each rounded down, then one up


def test_a_bills_total_reads_as_money_shows_it_and_its_lines_add_up() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        currency = rng.choice(["USD", "JPY", "BHD"])
        lines = [round(rng.uniform(0, 10 ** rng.randint(-4, 5)), 6) for _ in range(rng.randint(1, 6))]
        total = round(sum(lines), 6)
        units, whole, digits = bill(lines, total, currency)
        assert sum(units) == whole
        assert fixed_units(whole, digits, minor_digits(currency)) == money(total, currency)
        for u, line in zip(units, lines, strict=True):  # no line moved by more than a unit (and rounding)
            assert abs(u - line * 10 ** digits) < 1 + 1e-6 * 10 ** digits


def test_fixed_units() -> None:
    assert [fixed_units(105, 3, 2), fixed_units(100, 3, 2), fixed_units(100, 3), fixed_units(-5, 2, 2),
            fixed_units(0, 2, 2), fixed_units(7, 0, 0), fixed_units(-0, 3)] == \
        ["0.105", "0.10", "0.100", "-0.05", "0.00", "7", "0.000"]
