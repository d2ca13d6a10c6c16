"""The `prices:` section: defaults from the profiles, versions in order, refusals in one sentence."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.config import parse_config
from gpupool.errors import InvalidInput


def test_default_book_takes_the_profiles_reference_prices() -> None:
    book = parse_config("").prices.price_book()
    [version] = book.versions
    assert version.device_price("A100-80GB") == 1.8 and version.device_price("a100") == 1.8
    assert version.device_price("G2") is None and book.currency == "USD"


def test_an_entry_overrides_the_reference_and_tiers_are_read() -> None:
    config = parse_config("prices:\n  versions:\n    - effective_from: 2026-12-01\n"
                          "      devices: {A100: 2.0}\n      other_devices: 0.5\n"
                          "      tiers: [{start: '22:00', end: '06:00', multiplier: 0.5}]\n")
    [version] = config.prices.price_book().versions
    assert version.effective_from_s == 1_796_083_200.0
    assert version.device_price("A100-80GB") == 2.0 and version.device_price("G2") == 0.5
    assert version.tier_seconds(0.0, 86_400.0) == pytest.approx(86_400 - 8 * 3600 * 0.5)


@pytest.mark.parametrize(("text", "words"), [
    ("prices:\n  versions:\n    - effective_from: 2026-12-01\n    - effective_from: 2026-01-01\n",
     "oldest first"),
    ("prices:\n  versions:\n    - tiers: [{start: '25:00', end: '06:00', multiplier: 1}]\n", "HH:MM"),
    ("prices:\n  versions: []\n", "prices.versions"),
    ("prices:\n  colour: red\n", "colour"),
    # two windows over one hour: their multipliers added up (a negative price with two discounts)
    ("prices:\n  versions:\n    - tiers: [{start: '22:00', end: '06:00', multiplier: 0.5},\n"
     "                {start: '00:00', end: '08:00', multiplier: 0.4}]\n",
     "tiers 22:00-06:00 and 00:00-08:00 overlap (00:00-06:00)"),
    ("prices:\n  versions:\n    - tiers: [{start: '09:00', end: '09:00', multiplier: 2},\n"
     "                {start: '12:00', end: '13:00', multiplier: 3}]\n", "overlap (12:00-13:00)"),
    # nan or inf was billed as 0 and marked priced, and a budget never ran out
    ("prices:\n  versions:\n    - devices: {H100: .nan}\n", "not negative, infinite or nan (H100)"),
    ("prices:\n  versions:\n    - devices: {H100: .inf}\n", "not negative, infinite or nan (H100)"),
    ("prices:\n  versions:\n    - priority_classes: {normal: .inf}\n", "infinite or nan (normal)"),
    ("prices:\n  versions:\n    - other_devices: .inf\n", "other_devices"),
])
def test_a_bad_price_book_is_refused_in_one_sentence(text: str, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_config(text)
    assert words in caught.value.message and "\n" not in caught.value.message


def _version(devices: str = "", tiers: str = "") -> Any:
    text = "prices:\n  versions:\n    - " + (f"devices: {devices}\n" if devices else f"tiers: {tiers}\n")
    [version] = parse_config(text).prices.price_book().versions
    return version


def test_windows_that_meet_are_not_an_overlap_and_each_hour_takes_its_own_multiplier() -> None:
    version = _version(tiers="[{start: '22:00', end: '06:00', multiplier: 0.5}, "
                             "{start: '06:00', end: '08:00', multiplier: 2}]")
    assert version.tier_seconds(0.0, 86_400.0) == pytest.approx(86_400 + 8 * 3600 * -0.5 + 2 * 3600 * 1.0)
    assert version.tier_seconds(3600.0, 5 * 3600.0) > 0


def test_a_name_listed_keeps_its_price_whatever_its_aliases_are_given() -> None:
    """A name priced its profile's every alias: the one listed later won, over a price given to the
    very name (A100 is an alias of A100-80GB; the V100 SXM2 and PCIe boards share a profile)."""
    for devices in ("{A100-80GB: 1.8, A100: 1.1}", "{A100: 1.1, A100-80GB: 1.8}"):
        version = _version(devices)
        assert (version.device_price("A100-80GB"), version.device_price("A100")) == (1.8, 1.1), devices
    version = _version("{Tesla V100-SXM2-16GB: 0.9, Tesla V100-PCIE-16GB: 0.5}")
    assert version.device_price("Tesla V100-SXM2-16GB") == 0.9
    assert version.device_price("Tesla V100-PCIE-16GB") == 0.5
    assert _version("{A100: 1.1}").device_price("A100-80GB") == 1.1, "a name alone still prices its aliases"


def test_a_later_version_keeps_what_it_does_not_name_and_only_dollars_start_from_the_reference() -> None:
    """A later version naming only H100 put A100 back to its reference price, and a yen book billed
    an unnamed H100 at the reference's dollars as as many yen."""
    book = parse_config("prices:\n  versions:\n    - effective_from: 2026-01-01\n      devices: {A100: 1.5}\n"
                        "    - effective_from: 2026-12-01\n      devices: {H100: 2.2}\n").prices.price_book()
    first, later = book.versions
    assert (first.device_price("A100"), later.device_price("A100"), later.device_price("H100")) == (
        1.5, 1.5, 2.2)
    assert first.device_price("H100") == _version("{A10: 1}").device_price("H100") > 0  # the reference
    yen = parse_config("prices:\n  currency: JPY\n  versions:\n    - devices: {A100: 200}\n")
    [version] = yen.prices.price_book().versions
    assert (version.device_price("A100"), version.device_price("H100")) == (200, None)
