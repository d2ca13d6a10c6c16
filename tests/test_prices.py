"""The `prices:` section: defaults from the profiles, versions in order, refusals in one sentence."""

from __future__ import annotations

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
])
def test_a_bad_price_book_is_refused_in_one_sentence(text: str, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_config(text)
    assert words in caught.value.message and "\n" not in caught.value.message
