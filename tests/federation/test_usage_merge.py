"""A hub adds its members' usage up only where it adds up: within one currency, and priced only where
every member priced it (a USD and a JPY member were summed as USD, an unpriced member's rows as priced)."""

from __future__ import annotations

import pytest

from gpupool.api.usage import UsageOut, UsageRowOut
from gpupool.errors import Conflict
from gpupool.federation.routes import merge_usage


def _row(cost: float, priced: bool = True) -> UsageRowOut:
    return UsageRowOut(tenant="alice", simulated=False, pods=1, device_hours=1.0, memory_gib_hours=0.0,
                       cost=cost, dedicated_cost=cost, saving=0.0, priced=priced)


def _part(currency: str, cost: float, priced: bool = True) -> UsageOut:
    return UsageOut(since_s=0.0, until_s=10.0, by=["tenant"], currency=currency, rows=[_row(cost, priced)],
                    total=_row(cost, priced))


def test_one_currency_adds_up_and_is_priced_only_where_every_member_priced_it() -> None:
    merged = merge_usage([_part("USD", 10.0), _part("USD", 5.0, priced=False)])
    assert merged.currency == "USD"
    [row] = merged.rows
    assert (row.cost, row.pods, row.priced) == (15.0, 2, False)
    assert (merged.total.cost, merged.total.priced) == (15.0, False)
    assert merge_usage([_part("USD", 10.0), _part("USD", 5.0)]).total.priced


def test_two_currencies_are_not_added_up() -> None:
    said = r"different currencies \(JPY, USD\), so their costs cannot be added up"
    with pytest.raises(Conflict, match=said):
        merge_usage([_part("USD", 10.0), _part("JPY", 1500.0, priced=False)])
