"""Usage and invoices end to end: pod rows -> GET /usage -> `gpupool usage` / `gpupool invoice`, under a
versioned price book, with tenant isolation; and a pod run by the live loop is metered."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import select, update
from typer.testing import CliRunner

from factories import node
from gpupool.cli.lazy import app
from gpupool.client import Client
from gpupool.config import parse_config
from gpupool.errors import NotFound
from gpupool.server.orm import PodRow, TenantRow, WorkloadRow
from live import LiveServer, cli_env, live_server
from server.fakes import ManualProvider

runner = CliRunner()
GIB = 1024
PRICES = """
prices:
  versions:
    - effective_from: 2026-11-01
      devices: {H100: 2.0}
    - effective_from: 2026-12-01
      devices: {H100: 4.0}
      priority_classes: {best-effort: 0.5}
"""


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


YEN = """
prices:
  currency: JPY
  versions:
    - effective_from: 2026-11-01
      devices: {H100: 1000}
"""


def _serving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prices: str) -> Iterator[LiveServer]:
    provider = ManualProvider([node("n0", devices=4, model="H100", device_memory_mib=80 * GIB)])
    with live_server(tmp_path, provider, config=parse_config(prices),
                     before_serving=cli_env(monkeypatch, COLUMNS="200")) as server:
        with Client(server.url, server.admin_token) as pool:
            pool.create_tenant("team-a")
            pool.create_tenant("team-b")
        yield server


@pytest.fixture
def srv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    yield from _serving(tmp_path, monkeypatch, PRICES)


@pytest.fixture
def yen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    yield from _serving(tmp_path, monkeypatch, YEN)


def _pod(server: LiveServer, tenant: str, pod_id: str, device: int, compute: int, memory_gib: int,
         start: float | None, end: float | None, cls: str = "normal", service: str = "") -> None:
    """A finished (or, with `end` None, running) pod of its own workload, written to the store."""
    with server.rt.store.write() as session:
        session.add(WorkloadRow(id=pod_id, name=pod_id, tenant=tenant, queue="default", status="succeeded",
                                priority=0, device_milli=compute,
                                spec={"command": ["true"], "priority_class": cls,
                                      **({"name": service, "serve_port": 8000} if service else {})},
                                attempt=1, submit_s=start or 0.0))
        session.flush()
        session.add(PodRow(id=f"{pod_id}-a1-r0", workload_id=pod_id, attempt=1, name="r0", rank=0,
                           status="succeeded" if end else "running", node="n0",
                           slices=[{"device_index": device, "compute_milli": compute,
                                    "memory_mib": memory_gib * GIB}],
                           cpu_milli=0, memory_mib=0, created_s=(start or at("2026-12-02T00:00")) - 5,
                           started_s=start, finished_s=end))


def _history(server: LiveServer) -> None:
    # across the month boundary and the price change: 1 h in November, 1 h in December
    _pod(server, "team-a", "a1", 0, 250, 20, at("2026-11-30T23:00"), at("2026-12-01T01:00"))
    # a whole device for 2 h at the best-effort multiplier
    _pod(server, "team-a", "a2", 1, 1000, 80, at("2026-12-10T00:00"), at("2026-12-10T02:00"),
         cls="best-effort")
    # waited, then stopped before it started: never metered
    _pod(server, "team-a", "a3", 2, 1000, 80, None, at("2026-12-11T00:00"))
    # a quarter of the compute but half the memory: priced as half a device
    _pod(server, "team-b", "b1", 3, 250, 40, at("2026-12-05T00:00"), at("2026-12-05T04:00"))


def gp(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_invoice_bills_the_month_with_the_prices_in_force(srv: LiveServer) -> None:
    _history(srv)
    code, out, err = gp("invoice", "--tenant", "team-a", "--month", "2026-12", "--json")
    assert code == 0, err
    lines = {(r["queue"], r["model"], r["priority_class"]): r for r in json.loads(out)}
    assert set(lines) == {("default", "H100", "normal"), ("default", "H100", "best-effort"),
                          ("TOTAL", "TOTAL", "TOTAL")}
    normal, cheap = lines[("default", "H100", "normal")], lines[("default", "H100", "best-effort")]
    assert normal["device_hours"] == pytest.approx(0.25) and normal["cost"] == pytest.approx(1.0)
    assert normal["dedicated_cost"] == pytest.approx(4.0)
    assert cheap["device_hours"] == pytest.approx(2.0) and cheap["cost"] == pytest.approx(4.0)
    assert cheap["memory_gib_hours"] == pytest.approx(160.0)
    assert lines[("TOTAL", "TOTAL", "TOTAL")]["cost"] == pytest.approx(5.0)
    code, out, _ = gp("invoice", "--tenant", "team-a", "--month", "2026-11", "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(rows) == 2 and rows[1]["queue"] == "TOTAL"
    assert float(rows[0]["cost"]) == pytest.approx(0.5) == float(rows[1]["cost"])
    assert float(rows[0]["device_hours"]) == pytest.approx(0.25)
    code, out, _ = gp("invoice", "--tenant", "team-a", "--month", "2026-10", "--json")
    assert code == 0 and [(r["queue"], r["pods"], r["cost"]) for r in json.loads(out)] == [("TOTAL", 0, 0.0)]
    code, _, err = gp("invoice", "--tenant", "team-a", "--month", "2026-13")
    assert code == 2 and "--month takes a month such as 2026-12" in err and "Traceback" not in err


def test_invoice_has_a_line_per_service_from_the_rollup_as_from_the_pods(srv: LiveServer) -> None:
    _history(srv)
    for n, service in enumerate(("chat", "chat", "embed")):  # replicas: a quarter device for 4 h each
        _pod(srv, "team-a", f"s{n}", 3, 250, 20, at("2026-12-12T00:00"), at("2026-12-12T04:00"),
             service=service)

    def lines() -> dict[tuple[str, str], dict]:  # type: ignore[type-arg]
        code, out, err = gp("invoice", "--tenant", "team-a", "--month", "2026-12", "--json")
        assert code == 0, err
        return {(r["priority_class"], r["service"]): r for r in json.loads(out)}

    before = lines()  # read from the pod rows
    assert set(before) == {("normal", ""), ("best-effort", ""), ("normal", "chat"), ("normal", "embed"),
                           ("TOTAL", "TOTAL")}
    assert before[("normal", "chat")]["pods"] == 2 and before[("normal", "chat")]["device_hours"] == 2.0
    assert before[("normal", "chat")]["cost"] == pytest.approx(8.0)
    assert before[("normal", "embed")]["device_hours"] == 1.0
    assert before[("normal", "")]["device_hours"] == 0.25
    srv.rt.usage_rollup.fold(srv.rt)  # (the loop may have folded them already)
    with srv.rt.store.read() as session:
        assert all(session.scalars(select(PodRow.rolled_up).where(PodRow.id.like("s%"))))
    assert lines() == before  # the same lines once the days are rolled up
    code, out, err = gp("invoice", "--tenant", "team-a", "--month", "2026-12")
    assert code == 0 and "SERVICE" in out and "chat" in out and "embed" in out, err


def test_usage_groups_and_prices_memory_heavy_slices_by_their_memory(srv: LiveServer) -> None:
    _history(srv)
    code, out, err = gp("usage", "--since", "2026-11-01", "--until", "2026-12-31", "--by", "tenant,day",
                        "--json")
    assert code == 0, err
    rows = {(r["tenant"], r["day"]): r for r in json.loads(out)}
    assert set(rows) == {("team-a", "2026-11-30"), ("team-a", "2026-12-01"), ("team-a", "2026-12-10"),
                         ("team-b", "2026-12-05")}
    b = rows[("team-b", "2026-12-05")]
    assert (b["device_hours"], b["cost"], b["dedicated_cost"], b["simulated"]) == (1.0, 8.0, 16.0, False)
    assert b["saving"] == 8.0
    code, out, _ = gp("usage", "--since", "2026-11-01", "--until", "2026-12-31")
    assert code == 0 and "team-a" in out and "TOTAL" in out and "DEDICATED USD" in out
    code, _, err = gp("usage", "--by", "colour")
    assert code == 2 and "Cannot group usage by 'colour'" in err


def _made_long_ago(server: LiveServer, tenant: str) -> None:
    """The tenant existed before the history `_history` writes (which is dated before it was made)."""
    with server.rt.store.write() as session:
        session.execute(update(TenantRow).where(TenantRow.name == tenant).values(created_s=0.0))


def test_a_tenant_sees_only_its_own_usage(srv: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    _history(srv)
    _made_long_ago(srv, "team-b")
    with Client(srv.url, srv.admin_token) as pool:
        token = pool.create_token("team-b", "mine").token
    monkeypatch.setenv("GPUPOOL_TOKEN", token)
    code, out, err = gp("usage", "--since", "2026-11-01", "--until", "2026-12-31", "--json")
    assert code == 0, err
    assert [r["tenant"] for r in json.loads(out)] == ["team-b"]
    code, out, err = gp("usage", "--tenant", "team-a", "--since", "2026-11-01", "--json")
    assert code == 3 and out == "" and "cannot act for 'team-a'" in err
    code, _, err = gp("invoice", "--tenant", "team-a", "--month", "2026-12")
    assert code == 3


def test_an_invoice_bills_the_tokens_own_tenant_for_this_month_unless_told(
        srv: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpupool invoice` alone: a tenant's token bills its tenant, for the current month (UTC); the
    admin, who bills any tenant, must name one."""
    _history(srv)
    _made_long_ago(srv, "team-b")
    now = datetime.now(UTC)
    this_month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()
    _pod(srv, "team-b", "b-now", 2, 1000, 80, this_month + 1, this_month + 1801)  # half an hour, this month
    code, _, err = gp("invoice", "--month", "2026-12")
    assert code == 2 and "Name the tenant billed: gpupool invoice --tenant NAME" in err, err
    with Client(srv.url, srv.admin_token) as pool:
        token = pool.create_token("team-b", "mine").token
    monkeypatch.setenv("GPUPOOL_TOKEN", token)
    code, out, err = gp("invoice", "--month", "2026-12", "--json")
    assert code == 0, err
    assert json.loads(out)[-1]["device_hours"] == pytest.approx(1.0 if now.strftime("%Y-%m") != "2026-12"
                                                                else 1.5)  # b1: a half device for 2 h
    code, out, err = gp("invoice", "--json")
    assert code == 0, err
    assert json.loads(out)[-1]["device_hours"] == pytest.approx(
        1.5 if now.strftime("%Y-%m") == "2026-12" else 0.5)
    code, out, _ = gp("invoice")
    assert code == 0 and f"Invoice for team-b, {now:%Y-%m} (UTC)" in out


def test_a_pod_the_loop_runs_is_metered_from_its_start(srv: LiveServer) -> None:
    provider = srv.rt.provider
    assert isinstance(provider, ManualProvider)
    with Client(srv.url, srv.admin_token) as pool:
        wid = pool.submit({"command": ["true"], "tenant": "team-a", "resources": {"gpus": 0.5}})
        pod_id = provider.finish_the_one_launched(srv.rt.wake)
        done = pool.wait(wid, timeout_s=20)
        assert done.status == "succeeded"
        assert done.finished_s is not None
        answer = pool.usage(tenant="team-a", since_s=done.submit_s - 1, until_s=done.finished_s + 1,
                            by=["tenant", "model"])
    with srv.rt.store.read() as session:
        row = session.get(PodRow, pod_id)
        assert row is not None and row.started_s is not None and row.finished_s is not None
        held_s = row.finished_s - row.started_s
    [usage] = answer.rows
    assert (usage.tenant, usage.model, usage.pods) == ("team-a", "H100", 1)
    assert usage.device_hours == pytest.approx(0.5 * held_s / 3600, abs=1e-6)


def test_usage_counters_match_the_bill_and_only_grow(srv: LiveServer) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gpupool.server.metrics_usage import UsageCollector

    _history(srv)
    _pod(srv, "team-b", "b2", 0, 500, 10, at("2026-12-20T00:00"), None)  # still running
    clock = {"now": at("2026-12-20T01:00")}
    srv.rt.clock = lambda: clock["now"]
    registry = CollectorRegistry()
    registry.register(UsageCollector(srv.rt))

    def scrape() -> dict[tuple[str, str], float]:
        text = generate_latest(registry).decode()
        return {(s.labels["tenant"], s.name): s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name.endswith("_total")}

    first = scrape()
    assert first[("team-a", "gpupool_device_seconds_total")] == pytest.approx(0.25 * 7200 + 7200)
    assert first[("team-b", "gpupool_device_seconds_total")] == pytest.approx(3600 + 0.5 * 3600)
    memory = first[("team-b", "gpupool_device_memory_gib_seconds_total")]
    assert memory == pytest.approx(40 * 14400 + 10 * 3600)
    clock["now"] += 3600  # the running pod held its half device an hour more
    second = scrape()
    assert second[("team-b", "gpupool_device_seconds_total")] == pytest.approx(3600 + 0.5 * 7200)
    assert all(second[k] >= v for k, v in first.items())
    with Client(srv.url, srv.admin_token) as pool:
        bill = pool.usage(since_s=at("2026-11-01"), until_s=clock["now"], by=["tenant"])
    for row in bill.rows:
        counted = second[(row.tenant or "", "gpupool_device_seconds_total")]
        assert counted == pytest.approx(row.device_hours * 3600)


def test_a_pod_closed_late_is_counted_and_the_counters_never_go_down(srv: LiveServer) -> None:
    """A pod seen running may be closed later at an end behind the watermark (a takeover's or a
    restart's recovery closes a stopping pod when the provider says it ended): its real usage joins
    the counters, which keep what they said (a counter that goes down reads as a reset) until the
    real usage passes it."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gpupool.server.metrics_usage import UsageCollector

    start = at("2026-12-20T00:00")
    _pod(srv, "team-a", "late", 0, 1000, 10, start + 100, None)
    clock = {"now": start}
    srv.rt.clock = lambda: clock["now"]
    registry = CollectorRegistry()
    registry.register(UsageCollector(srv.rt))

    def device_s(offset: float) -> float:
        clock["now"] = start + offset
        text = generate_latest(registry).decode()
        [value] = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "gpupool_device_seconds_total" and s.labels["tenant"] == "team-a"]
        return value

    assert device_s(1_000) == pytest.approx(900) and device_s(2_000) == pytest.approx(1_900)
    with srv.rt.store.write() as session:  # closed late: it ended long before the watermark
        row = session.get(PodRow, "late-a1-r0")
        assert row is not None
        row.status, row.finished_s = "stopped", start + 900
    assert device_s(2_005) == pytest.approx(1_900), "what was counted stays counted"
    _pod(srv, "team-a", "next", 1, 1000, 10, start + 2_010, None)
    assert device_s(3_010) == pytest.approx(1_900), "held until the real usage passes it"
    assert device_s(4_010) == pytest.approx(800 + 2_000), "the late pod's real usage, and the next one's"
    assert device_s(4_020) == pytest.approx(800 + 2_010)
    with Client(srv.url, srv.admin_token) as pool:
        bill = pool.usage(tenant="team-a", since_s=start, until_s=clock["now"], by=["tenant"])
    assert bill.rows[0].device_hours * 3600 == pytest.approx(800 + 2_010)


def test_small_amounts_keep_their_digits_in_the_table(srv: LiveServer) -> None:
    # a quarter device for 9 s in December (4.0/h): 0.0025, which two decimals would show as 0.00
    _pod(srv, "team-b", "tiny", 0, 250, 10, at("2026-12-20T00:00:00"), at("2026-12-20T00:00:09"))
    code, out, err = gp("invoice", "--tenant", "team-b", "--month", "2026-12")
    assert code == 0, err
    total = next(line for line in out.splitlines() if "TOTAL" in line)
    assert " 0.0025 " in total, out  # the minor unit, then the digits that carry the amount
    code, out, err = gp("invoice", "--tenant", "team-b", "--month", "2026-12", "-o", "json")
    assert code == 0 and [r["currency"] for r in json.loads(out)] == ["USD", "USD"]  # the line, the total


def _services_billed(server: LiveServer, seconds: float) -> None:
    """Three services of team-a, each a quarter device (a quarter of its memory) for `seconds` in
    December: three invoice lines of the same amount."""
    start = at("2026-12-12T00:00")
    for name in ("chat", "embed", "rank"):
        _pod(server, "team-a", name, 0, 250, 20, start, start + seconds, service=name)


def _table(out: str) -> tuple[list[list[str]], list[str]]:
    """An invoice table's lines and its TOTAL row, each as its cells (the line's key columns too)."""
    rows = [[cell.strip() for cell in line.strip("│┃ ").split("│")] for line in out.splitlines()
            if line.startswith("│")]
    total = next(row for row in rows if row[0] == "TOTAL")
    return [row for row in rows if row is not total], total



def test_invoice_lines_add_up_to_its_total(srv: LiveServer) -> None:
    """Three lines of 0.336 USD each are 1.008: shown as 0.34, 0.34 and 0.33 beside the TOTAL of
    1.01, not three of 0.34 (1.02); every summed column adds up; JSON and CSV end with the total."""
    _services_billed(srv, 0.336 * 3600)  # 0.25 device x 0.336 h x 4.0/h = 0.336
    code, out, err = gp("invoice", "--tenant", "team-a", "--month", "2026-12")
    assert code == 0, err
    lines, total = _table(out)
    assert len(lines) == 3, out
    assert [line[-3] for line in lines] == ["0.34", "0.34", "0.33"] and total[-3] == "1.01", out
    for column in range(-5, 0):  # device-hours, memory GiB-hours and the three amounts
        assert sum(Decimal(line[column]) for line in lines) == Decimal(total[column]), (column, out)
    assert [total[c] for c in range(-6, 0)] == ["3", "0.252", "20.2", "1.01", "4.03", "3.02"], out
    for line in [*lines, total]:  # the saving is what the line's dedicated cost less its cost show
        assert Decimal(line[-2]) - Decimal(line[-3]) == Decimal(line[-1]), out
    code, out, err = gp("invoice", "--tenant", "team-a", "--month", "2026-12", "-o", "json")
    assert code == 0, err
    *billed, last = json.loads(out)
    assert [r["service"] for r in billed] == ["chat", "embed", "rank"]
    assert {k: last[k] for k in ("queue", "model", "priority_class", "service", "pods", "currency")} == \
        {"queue": "TOTAL", "model": "TOTAL", "priority_class": "TOTAL", "service": "TOTAL", "pods": 3,
         "currency": "USD"}
    assert last["cost"] == pytest.approx(1.008) and set(last) == set(billed[0])  # the lines' fields
    code, out, err = gp("invoice", "--tenant", "team-a", "--month", "2026-12", "-o", "csv")
    assert code == 0, err
    header, *rows = list(csv.reader(io.StringIO(out)))
    assert header == ["queue", "model", "priority_class", "service", "simulated", "pods", "device_hours",
                      "memory_gib_hours", "cost", "dedicated_cost", "saving", "priced"]
    assert len(rows) == 4 and rows[-1][:4] == ["TOTAL"] * 4 and float(rows[-1][8]) == pytest.approx(1.008)


def test_invoice_lines_add_up_in_a_currency_without_a_minor_unit(yen: LiveServer) -> None:
    """Three lines of 1004.4 JPY are 3013.2: 1005, 1004 and 1004 beside the TOTAL of 3013."""
    _services_billed(yen, 1004.4 / 250 * 3600)  # 0.25 device at 1000/h
    code, out, err = gp("invoice", "--tenant", "team-a", "--month", "2026-12")
    assert code == 0, err
    lines, total = _table(out)
    assert [line[-3] for line in lines] == ["1005", "1004", "1004"] and total[-3] == "3013", out
    for column in range(-5, 0):
        assert sum(Decimal(line[column]) for line in lines) == Decimal(total[column]), (column, out)
    for line in [*lines, total]:
        assert int(line[-2]) - int(line[-3]) == int(line[-1]), out


def test_a_deleted_tenants_usage_stays_for_the_admin_and_one_made_again_under_its_name_sees_none(
        srv: LiveServer) -> None:
    """Deleting a tenant folds its pods into the rollup and deletes their rows: its usage of today
    is read from the rollup then (usage missed it while invoice showed it); a tenant made later
    under the same name is someone else, whose usage starts when it was made."""
    now = srv.rt.clock()
    with Client(srv.url, srv.admin_token) as pool:
        pool.create_tenant("team-c")
        _pod(srv, "team-c", "c1", 0, 1000, 80, now - 2 * 3600, now - 3600)  # an hour of a device today
        before = pool.usage(tenant="team-c", by=["tenant"])
        pool.delete_tenant("team-c")
        after = pool.usage(tenant="team-c", by=["tenant"])
        whole = pool.usage(by=["tenant"])
        assert [(r.tenant, r.device_hours) for r in before.rows] == [("team-c", 1.0)]
        assert [(r.tenant, r.device_hours, r.cost) for r in after.rows] == \
            [(r.tenant, r.device_hours, r.cost) for r in before.rows]
        assert "team-c" in [r.tenant for r in whole.rows]
        pool.create_tenant("team-c")  # someone else, later, under the same name
        token = pool.create_token("team-c", "new").token
        assert [r.tenant for r in pool.usage(tenant="team-c", by=["tenant"]).rows] == ["team-c"]  # the admin
        with pytest.raises(NotFound, match="No tenant named 'team-z', and no usage under that name"):
            pool.usage(tenant="team-z", by=["tenant"])  # nothing of that name, ever
        assert pool.usage(tenant="team-c", since_s=now - 3600, until_s=now, by=["tenant"]).rows == []
    with Client(srv.url, token) as theirs:
        assert theirs.usage(by=["tenant"]).rows == []
        assert theirs.usage(since_s=now - 40 * 86_400, until_s=now + 40 * 86_400, by=["tenant"]).rows == []
        assert theirs.usage(since_s=now - 3 * 3600, until_s=now - 1800, by=["tenant"]).rows == []
