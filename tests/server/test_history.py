"""The pool's history (services/history.py, GET /history): one sample per minute written once however
often it is tried, minute rows rolled up into hours after a day with the right means, rows past the
retention deleted, a tenant reading only its own usage, and NVML's readings carried to the answer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from conftest import Server, start_server, stop_server
from factories import node
from gpupool.core.metering import DAY_S
from gpupool.providers.base import DeviceReading
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops.history import HistorySampler
from gpupool.server.orm import HistoryRow, TenantRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import history
from gpupool.server.services.history import HOUR_S, MINUTE_S, Point
from gpupool.server.settings import Settings
from server.fakes import ManualProvider

ADMIN = Principal(token_id="test", tenant=None)
NOW = 1_796_083_200.0 + 10 * DAY_S + 7 * HOUR_S + 30.0  # mid-minute, mid-morning


@pytest.fixture
def rt(db_url: str, tmp_path: Path) -> Iterator[Runtime]:
    runtime = Runtime(settings=Settings(data_dir=tmp_path, database_url=db_url), store=Store.open(db_url),
                      provider=ManualProvider([node("n0", devices=2, model="H100")]))
    runtime.clock = lambda: NOW
    yield runtime
    runtime.store.close()


def _rows(rt: Runtime, **where: object) -> list[HistoryRow]:
    with rt.store.read() as session:
        query = select(HistoryRow).filter_by(**where).order_by(HistoryRow.series, HistoryRow.at_s,
                                                               HistoryRow.key)
        found = list(session.scalars(query))
        session.expunge_all()
        return found


def _minute(rt: Runtime, at: float, alloc: float, tenants: dict[str, float],
            busy: float | None = None) -> int:
    points = [Point("capacity", "", 2000.0), Point("allocated", "", alloc), Point("pending", "", 500.0)]
    points += [Point("tenant", t, v) for t, v in tenants.items()]
    points += [Point("device", "n0/0", alloc, busy, None if busy is None else 1000.0)]
    return history.record(rt, at, points)


def test_a_minute_is_recorded_once_whoever_tries_again(rt: Runtime) -> None:
    minute = history.minute_of(NOW)
    assert _minute(rt, minute, 1000.0, {"a": 1000.0}) == 5
    # a restart, or a second server, samples the same minute with other values: nothing changes
    assert _minute(rt, minute, 1500.0, {"a": 500.0, "b": 1000.0}) == 0
    assert [(r.series, r.key, r.value) for r in _rows(rt)] == [
        ("allocated", "", 1000.0), ("capacity", "", 2000.0), ("device", "n0/0", 1000.0),
        ("pending", "", 500.0), ("tenant", "a", 1000.0)]
    # the sampler itself: one write per minute however often it steps
    sampler = HistorySampler(rt)
    assert sampler.step(NOW + 60) > 0
    assert sampler.step(NOW + 61) == 0
    assert len(_rows(rt, series="capacity")) == 2


def test_old_minutes_roll_up_into_hours_with_the_right_means(rt: Runtime) -> None:
    old_hour = float(int((NOW - 2 * DAY_S) // HOUR_S) * HOUR_S)
    for m in range(60):  # tenant b holds a device in the first 15 minutes only; utilisation measured half
        _minute(rt, old_hour + m * MINUTE_S, 1000.0 + m, {"a": 1000.0, **({"b": 1000.0} if m < 15 else {})},
                busy=40.0 if m % 2 else None)
    recent = history.minute_of(NOW) - 10 * MINUTE_S  # in the hour that just ended
    current = history.minute_of(NOW)  # in the hour under way: not rolled up yet
    _minute(rt, recent, 2000.0, {"a": 2000.0})
    _minute(rt, current, 2000.0, {"a": 2000.0})
    assert history.roll_up(rt, NOW) == 2
    recent_hour = float(int(recent // HOUR_S) * HOUR_S)
    assert {r.at_s for r in _rows(rt, step_s=HOUR_S)} == {old_hour, recent_hour}
    hourly = {(r.series, r.key): r for r in _rows(rt, step_s=HOUR_S, at_s=old_hour)}
    assert hourly[("allocated", "")].value == pytest.approx(1000.0 + 59 / 2)
    assert hourly[("tenant", "a")].value == pytest.approx(1000.0)
    assert hourly[("tenant", "b")].value == pytest.approx(250.0)  # 15 of 60 minutes: a quarter
    device = hourly[("device", "n0/0")]
    assert device.busy_pct == pytest.approx(40.0) and device.memory_mib == pytest.approx(1000.0)
    minutes = _rows(rt, step_s=MINUTE_S)
    assert {r.at_s for r in minutes} == {recent, current}  # the old hour's minutes gone, the day's kept
    assert history.roll_up(rt, NOW) == 0  # again: nothing more
    assert len(_rows(rt, step_s=HOUR_S, at_s=old_hour)) == len(hourly)


def test_a_roll_up_another_server_made_is_kept(rt: Runtime) -> None:
    old_hour = float(int((NOW - 3 * DAY_S) // HOUR_S) * HOUR_S)
    history.record(rt, old_hour, [Point("capacity", "", 2000.0), Point("allocated", "", 100.0)])
    with rt.store.write() as session:  # the other server's hourly row for the same hour
        session.add(HistoryRow(series="allocated", step_s=HOUR_S, at_s=old_hour, key="", value=7.0))
    assert history.roll_up(rt, NOW) == 1
    kept = _rows(rt, series="allocated", step_s=HOUR_S)
    assert [r.value for r in kept] == [7.0]
    assert not _rows(rt, step_s=MINUTE_S)


def test_rows_past_the_retention_are_deleted(rt: Runtime) -> None:
    for age_days in (31, 29):
        history.record(rt, history.minute_of(NOW - age_days * DAY_S), [Point("capacity", "", 1.0)])
    assert history.expire(rt, NOW, 30.0) == 1
    assert [round((NOW - r.at_s) / DAY_S) for r in _rows(rt)] == [29]


def test_query_means_per_point_and_fills_a_tenants_idle_minutes(rt: Runtime) -> None:
    first = history.minute_of(NOW) - 9 * MINUTE_S
    for m in range(10):
        _minute(rt, first + m * MINUTE_S, 1000.0, {"a": 1000.0} if m < 5 else {"b": 500.0})
    out = history.query(rt, ADMIN, "tenants", "1h", NOW)
    assert out.step_s == 60 and [s.name for s in out.series] == ["a", "b"]
    a, b = out.series
    assert [v for _, v in a.values] == [1.0] * 5 + [0.0] * 5
    assert [v for _, v in b.values] == [0.0] * 5 + [0.5] * 5
    alloc = history.query(rt, ADMIN, "allocation", "24h", NOW)
    assert alloc.step_s == 300 and [s.name for s in alloc.series] == ["capacity", "allocated"]
    assert all(v == 1.0 for _, v in alloc.series[1].values)
    devices = history.query(rt, ADMIN, "devices", "1h", NOW).devices
    assert [(d.node, d.index, d.allocated, d.busy_pct) for d in devices] == [("n0", 0, 1.0, None)]
    _minute(rt, first + 10 * MINUTE_S, 0.0, {}, busy=30.0)  # measured once in 11 minutes; idle then
    (device,) = history.query(rt, ADMIN, "devices", "1h", NOW).devices
    assert device.busy_pct == 30.0 and device.allocated == pytest.approx(10 / 11, abs=1e-6)
    mine = history.query(rt, Principal(token_id="t", tenant="b"), "tenants", "1h", NOW)
    assert [s.name for s in mine.series] == ["b"]


def test_a_tenant_made_under_a_deleted_ones_name_reads_its_own_minutes_only(rt: Runtime) -> None:
    """History is kept by the tenant's name: a tenant made later under it is someone else, whose
    series starts when it was made; the admin reads the name's whole series."""
    first = history.minute_of(NOW) - 9 * MINUTE_S
    for m in range(10):  # b held a device for 5 minutes; deleted; a new b holds half of one since
        _minute(rt, first + m * MINUTE_S, 1000.0, {"b": 1000.0 if m < 5 else 500.0})
    with rt.store.write() as session:
        session.add(TenantRow(name="b", created_s=first + 5 * MINUTE_S - 1))
    mine = history.query(rt, Principal(token_id="t", tenant="b"), "tenants", "1h", NOW)
    assert [v for _, v in mine.series[0].values] == [0.0] * 5 + [0.5] * 5
    whole = history.query(rt, ADMIN, "tenants", "1h", NOW)
    assert [v for _, v in whole.series[0].values] == [1.0] * 5 + [0.5] * 5


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    provider = _Measured([node("n0", devices=2, model="H100")])
    server = start_server(tmp_path_factory.mktemp("history"), provider=provider)
    yield server
    stop_server(server)


class _Measured(ManualProvider):
    """Device 0 of n0 reads as NVML would report a busy device; device 1 is not measured."""

    def device_readings(self) -> dict[tuple[str, int], DeviceReading]:
        return {("n0", 0): DeviceReading(87.0, 4096.0)}


def _token(server: Server, tenant: str) -> str:
    server.created("/tenants", {"name": tenant})
    return str(server.created("/tokens", {"tenant": tenant})["token"])


def test_the_live_sample_holds_allocation_tenants_and_readings(live: Server) -> None:
    alpha, beta = _token(live, "alpha"), _token(live, "beta")
    for token in (alpha, beta):
        answer = live.client.post("/api/v1/workloads", headers=live.headers(token),
                                  json={"command": ["true"], "resources": {"gpus": 0.5}})
        assert answer.status_code == 201, answer.text
    live.wait_for(lambda: len(live.provider.running()) == 2)
    now = live.rt.clock()
    history.record(live.rt, history.minute_of(now) + 3600, history.sample(live.rt))  # a minute of its own
    whole = live.client.get("/api/v1/history", params={"metric": "tenants"}, headers=live.headers()).json()
    latest = {s["name"]: s["values"][-1][1] for s in whole["series"]}
    assert latest == {"alpha": 0.5, "beta": 0.5}
    mine = live.client.get("/api/v1/history", headers=live.headers(alpha)).json()
    assert [s["name"] for s in mine["series"]] == ["alpha"]
    devices = live.client.get("/api/v1/history", params={"metric": "devices"}, headers=live.headers()).json()
    by_index = {d["index"]: d for d in devices["devices"]}
    assert by_index[0]["busy_pct"] is not None and by_index[1]["busy_pct"] is None
    assert by_index[1]["memory_used_mib"] is None


@pytest.mark.parametrize("metric", ["allocation", "pending", "devices"])
def test_a_tenant_is_refused_the_pools_series_with_a_sentence(live: Server, metric: str) -> None:
    token = _token(live, f"nosy-{metric}")
    answer = live.client.get("/api/v1/history", params={"metric": metric}, headers=live.headers(token))
    assert answer.status_code == 403
    assert "metric=tenants" in answer.json()["message"]


def test_bad_input_is_a_sentence(live: Server) -> None:
    for params in ({"range": "2y"}, {"metric": "gossip"}):
        answer = live.client.get("/api/v1/history", params=params, headers=live.headers())
        assert answer.status_code == 422, answer.text
        assert answer.json()["message"]


def test_retention_setting_is_checked() -> None:
    with pytest.raises(Exception, match="GPUPOOL_HISTORY_DAYS"):
        Settings(history_days=-1)
    assert Settings().with_env({"GPUPOOL_HISTORY_DAYS": "7"}).history_days == 7.0
    with pytest.raises(Exception, match="number of days"):
        Settings().with_env({"GPUPOOL_HISTORY_DAYS": "a month"})



def test_the_local_provider_reads_nvml_and_simulated_devices_are_never_measured(tmp_path: Path) -> None:
    from agent.probes.test_nvml_probe import fake_nvml
    from gpupool.agent.probes.nvml import NvmlProbe
    from gpupool.providers.local import LocalProvider

    real = LocalProvider(tmp_path / "real", node_name="gpu0", probe=NvmlProbe(fake_nvml()))
    simulated = LocalProvider(tmp_path / "sim", node_name="sim0", simulate="2xH100")
    try:
        assert [d.index for d in real.nodes()[0].devices] == [0, 1]
        assert real.device_readings() == {("gpu0", 0): DeviceReading(37, 512),
                                          ("gpu0", 1): DeviceReading(37, 512)}
        assert simulated.device_readings() == {}
    finally:
        real.close()
        simulated.close()


def test_two_servers_sampling_one_minute_at_once_record_one_sample(rt: Runtime) -> None:
    """Both write in the same instant (on PostgreSQL, truly at once): one sample wins whole."""
    minute = history.minute_of(NOW)
    barrier = threading.Barrier(2)
    written: list[int] = []

    def server(alloc: float, tenant: str) -> None:
        barrier.wait()
        written.append(_minute(rt, minute, alloc, {tenant: alloc}))

    threads = [threading.Thread(target=server, args=args) for args in ((1000.0, "a"), (1500.0, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(written) == [0, 5]
    rows = {(r.series, r.key): r.value for r in _rows(rt)}
    winner = rows[("allocated", "")]
    assert rows == {("capacity", ""): 2000.0, ("allocated", ""): winner, ("pending", ""): 500.0,
                    ("tenant", "a" if winner == 1000.0 else "b"): winner, ("device", "n0/0"): winner}


def test_the_sampler_rolls_up_and_expires_once_an_hour(rt: Runtime) -> None:
    old = history.minute_of(NOW - 40 * DAY_S)
    day_old = float(int((NOW - 2 * DAY_S) // HOUR_S) * HOUR_S)
    history.record(rt, old, [Point("capacity", "", 1.0)])
    history.record(rt, day_old, [Point("capacity", "", 1.0)])
    sampler = HistorySampler(rt)
    writes = 0
    write = rt.store.write

    def counted() -> Any:
        nonlocal writes
        writes += 1
        return write()

    rt.store.write = counted  # type: ignore[method-assign]
    try:
        sampler.step(NOW)
    finally:
        rt.store.write = write  # type: ignore[method-assign]
    assert {(r.step_s, r.at_s) for r in _rows(rt)} == {(HOUR_S, day_old), (MINUTE_S, history.minute_of(NOW))}
    assert writes <= 8, f"{writes} write transactions for two old minutes: the delete walked the gap"


def test_a_week_reads_hours_and_a_day_reads_minutes_never_both(rt: Runtime) -> None:
    hour = float(int(NOW // HOUR_S) * HOUR_S) - 2 * HOUR_S
    for m in range(60):
        _minute(rt, hour + m * MINUTE_S, 1000.0 if m < 30 else 0.0, {}, busy=50.0)
    history.roll_up(rt, NOW)
    week = history.query(rt, ADMIN, "allocation", "7d", NOW)
    assert [s.values for s in week.series] == [[(hour, 2.0)], [(hour, 0.5)]]
    day = history.query(rt, ADMIN, "allocation", "24h", NOW)
    assert [v for _, v in day.series[1].values] == [1.0] * 6 + [0.0] * 6  # twelve 5-minute points
    with rt.store.write() as session:  # the hourly row alone answers a day's device means
        session.query(HistoryRow).filter_by(series="device", step_s=HOUR_S).update({"busy_pct": 10.0})
    (device,) = history.query(rt, ADMIN, "devices", "24h", NOW).devices
    assert device.busy_pct == 10.0 and device.allocated == pytest.approx(0.5)
    (device,) = history.query(rt, ADMIN, "devices", "1h", hour + 90 * MINUTE_S).devices
    assert device.busy_pct == 50.0 and device.allocated == pytest.approx(0.0)  # the last half hour
