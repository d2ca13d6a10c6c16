"""The daily usage rollup answers exactly what metering every pod row answers (random pods spanning
midnights, open pods, mixed and simulated models, price versions changing mid-day, folds at random
times, a price book changed under it); and a pod's usage keeps its device model after its node left."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from factories import node
from gpupool.api.usage import UsageOut, UsageRowOut
from gpupool.config import PoolConfig, parse_config
from gpupool.core.metering import DAY_S, PriceBook, PriceVersion, Tier, UsageKey, price_key
from gpupool.core.model import Device, Node, Slice
from gpupool.prices import PricesConfig
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.orm import PodRow, QueueRow, TenantRow, UsageDailyServiceRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import metering, usage, usage_rollup
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings
from live import LiveServer, live_server
from server.fakes import ManualProvider

ADMIN = Principal(token_id="test", tenant=None)
START = 1_796_083_200.0  # 2026-12-01T00:00Z
NOW = START + 9 * DAY_S + 13 * 3600.0
BYS = ("tenant", "tenant,model,day", "queue,model,priority_class", "node", "day", "model",
       "priority_class,day", "service", "queue,model,priority_class,service", "service,day")


def _book(shift_s: float = 0.0) -> PriceBook:
    """Three versions, the later two taking effect in the middle of a day, with tiers and classes."""
    prices = {price_key("H100"): 4.0, price_key("A100"): 2.0}
    return PriceBook((
        PriceVersion(0.0, prices, None, {"best-effort": 0.5}),
        PriceVersion(START + 2 * DAY_S + 5 * 3600.0 + shift_s, {**prices, price_key("A100"): 3.0}, 1.0,
                     {"best-effort": 0.25}, (Tier(22 * 3600.0, 6 * 3600.0, 0.5),)),
        PriceVersion(START + 6 * DAY_S + 17.5 * 3600.0, prices, None, {},
                     (Tier(9 * 3600.0, 17 * 3600.0, 2.0),)),
    ))


def _mixed(name: str, simulated: bool = False) -> Node:
    devices = tuple(Device(f"{name}-{i}", "H100" if i < 2 else ("A100" if i < 4 else "T4"), i,
                           81_920 if i < 4 else 16_384, simulated=simulated) for i in range(6))
    return Node(name, 64_000, 262_144, devices)


@pytest.fixture
def rt(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    book = {"now": _book()}
    monkeypatch.setattr(PricesConfig, "price_book", lambda self: book["now"])
    runtime = Runtime(settings=Settings(data_dir=tmp_path, database_url=db_url), store=Store.open(db_url),
                      provider=ManualProvider([_mixed("n0"), _mixed("n1"), _mixed("s0", simulated=True)]),
                      config=parse_config("priority_classes:\n  - {name: normal, value: 0}\n"
                                          "  - {name: best-effort, value: -10}\n"))
    runtime.clock = lambda: NOW
    bootstrap(runtime)
    runtime.book = book  # type: ignore[attr-defined]
    yield runtime
    runtime.store.close()


def _history(rt: Runtime, rng: random.Random, count: int) -> None:
    """`count` random pods: most ended (some over midnights, some a second long), some running,
    some never started; models recorded at launch for most, not for some (older rows)."""
    nodes = {n.name: n for n in rt.nodes()}
    with rt.store.write() as session:
        for t in range(3):
            session.add(TenantRow(name=f"t{t}", created_s=START))
            session.flush()
            session.add_all([QueueRow(tenant=f"t{t}", name=q, created_s=START) for q in ("default", "q2")])
        session.flush()
        for i in range(count):
            tenant, name = f"t{i % 3}", rng.choice(sorted(nodes))
            start = START + rng.uniform(0, 9.4 * DAY_S)
            length = rng.choice([1.0, rng.expovariate(1 / 5000), rng.uniform(0, 3 * DAY_S)])
            end = None if rng.random() < 0.1 else min(start + length, NOW - 1)
            started = None if rng.random() < 0.05 else start
            slots = rng.sample(range(6), rng.choice([1, 1, 2, 3]))
            slices = [{"device_index": d, "compute_milli": rng.choice([100, 250, 1000]),
                       "memory_mib": rng.choice([0, 8192, 40_960])} for d in slots]
            models = (metering.slice_models(nodes[name], [_slice(s) for s in slices])
                      if rng.random() < 0.8 else None)
            session.add(WorkloadRow(id=f"w{i}", name="", tenant=tenant, queue=rng.choice(["default", "q2"]),
                                    status="running", priority=0, device_milli=0,
                                    spec={"command": ["x"], **({"priority_class": "best-effort"}
                                                               if rng.random() < 0.3 else {}),
                                          **({"name": f"svc{i % 2}", "serve_port": 8000}  # a replica
                                             if rng.random() < 0.3 else {})},
                                    attempt=1, submit_s=start))
            session.flush()
            session.add(PodRow(id=f"w{i}-a1-r0", workload_id=f"w{i}", attempt=1, name="r0", rank=0,
                               status="running" if end is None else "succeeded", node=name, slices=slices,
                               models=models, cpu_milli=0, memory_mib=0, created_s=start, started_s=started,
                               finished_s=None if end is None else max(end, start)))


def _slice(s: dict[str, int]) -> Slice:
    return Slice(s["device_index"], s["compute_milli"], s["memory_mib"])


def _same(got: UsageOut, want: UsageOut) -> None:
    assert len(got.rows) == len(want.rows)
    for a, b in [*zip(got.rows, want.rows, strict=True), (got.total, want.total)]:
        _same_row(a, b)


def _same_row(a: UsageRowOut, b: UsageRowOut) -> None:
    exact = {"tenant", "queue", "model", "priority_class", "node", "day", "simulated", "pods", "priced",
             "service"}
    assert a.model_dump(include=exact) == b.model_dump(include=exact)
    for name in ("device_hours", "memory_gib_hours", "cost", "dedicated_cost", "saving"):
        assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-9, abs=2e-6), name


def _compare(rt: Runtime, rng: random.Random, rounds: int) -> None:
    for _ in range(rounds):
        since = START - DAY_S + rng.choice([0.0, rng.uniform(0, 10 * DAY_S), 2 * DAY_S])
        until = rng.choice([NOW, since + rng.uniform(1, 8 * DAY_S), since + 4 * DAY_S])
        by, tenant = rng.choice(BYS), rng.choice([None, None, "t1"])
        args = dict(tenant=tenant, since_s=since, until_s=until, by=by)
        _same(usage.usage(rt, ADMIN, **args), metering.raw_usage(rt, ADMIN, **args))  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_rollup_answers_what_the_pod_rows_answer(rt: Runtime, seed: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    _history(rt, rng, 160)
    _compare(rt, rng, 6)  # nothing rolled up yet
    monkeypatch.setattr(usage_rollup, "FOLD_BATCH", 50)  # folded in parts, the rest read from the pods
    while rt.usage_rollup.fold(rt):
        _compare(rt, rng, 6)
        with rt.store.write() as session:  # some running pods end meanwhile
            for pod in session.scalars(select(PodRow).where(PodRow.finished_s.is_(None)).limit(5)):
                ended = max(NOW - rng.uniform(0, 2 * DAY_S), pod.started_s or 0.0)
                pod.finished_s, pod.status = ended, "failed"
    with rt.store.read() as session:
        assert session.scalar(select(func.count()).select_from(UsageDailyServiceRow))
        assert session.scalar(select(func.count()).where(PodRow.rolled_up.is_(False),
                                                         PodRow.finished_s.is_not(None))) == 0
    _compare(rt, rng, 10)
    # the rollup itself holds each service's days (an invoice's line per service reads summed rows)
    with rt.store.read() as session:
        wanted = usage_rollup.digest(rt.book["now"], "normal")  # type: ignore[attr-defined]
        rolled = usage_rollup.read(session, wanted, [UsageKey.SERVICE], START, START + 9 * DAY_S, None)
    assert rolled.usable and {keys[0] for keys in rolled.rows} == {"", "svc0", "svc1"}
    # a whole-days window: the rollup alone, but for the running pods
    whole = dict(tenant=None, since_s=START, until_s=START + 9 * DAY_S, by="tenant,model")
    _same(usage.usage(rt, ADMIN, **whole), metering.raw_usage(rt, ADMIN, **whole))  # type: ignore[arg-type]


def test_a_changed_price_book_is_not_read_from_the_rollup_and_is_rebuilt(rt: Runtime) -> None:
    rng = random.Random(7)
    _history(rt, rng, 120)
    rt.usage_rollup.fold(rt)
    before = usage.usage(rt, ADMIN, tenant=None, since_s=START, until_s=NOW, by="tenant")
    rt.book["now"] = _book(shift_s=-4 * 3600.0)  # type: ignore[attr-defined]
    args = dict(tenant=None, since_s=START, until_s=NOW, by="tenant")
    changed = usage.usage(rt, ADMIN, **args)  # type: ignore[arg-type]
    _same(changed, metering.raw_usage(rt, ADMIN, **args))  # type: ignore[arg-type]
    assert changed.total.cost != pytest.approx(before.total.cost)
    assert rt.usage_rollup.fold(rt) > 0  # rebuilt from every ended pod under the new prices
    _same(usage.usage(rt, ADMIN, **args), changed)  # type: ignore[arg-type]


def test_a_deleted_tenants_usage_stays_whole_for_any_window_and_after_a_change_of_prices(
        rt: Runtime) -> None:
    """Deleting t1 deletes its pod rows: what the rollup holds of it stayed, but the partial days of a
    window (read from the pods) lost its usage there, and a change of prices (which rebuilds the
    rollup from the pods) lost all of it. Its pods' intervals are kept (retired_pods) and read as the
    pods are: every window answers after the delete what it answered before, and after a change of
    prices what metering every interval answers, t1 repriced with the others."""
    from gpupool.server.orm import RetiredPodRow
    from gpupool.server.services.tenants import delete_tenant

    rng = random.Random(11)
    _history(rt, rng, 150)
    with rt.store.write() as session:  # t1's work ends (a tenant is deleted only then)
        for row in session.scalars(select(WorkloadRow).where(WorkloadRow.tenant == "t1")):
            row.status = "succeeded"
        for pod in session.scalars(select(PodRow).join(WorkloadRow).where(WorkloadRow.tenant == "t1",
                                                                          PodRow.finished_s.is_(None))):
            pod.finished_s, pod.status = NOW - 600, "succeeded"
    rt.usage_rollup.fold(rt)
    windows = [dict(since_s=START + 3.5 * 3600, until_s=NOW - 7000),  # partial days at both ends
               dict(since_s=START, until_s=NOW), dict(since_s=START + 2 * DAY_S, until_s=START + 5 * DAY_S),
               dict(since_s=START + 4 * DAY_S + 60, until_s=START + 4 * DAY_S + 9000)]  # within one day
    asks = [dict(tenant=tenant, by=by, **w) for w in windows for tenant in (None, "t1")
            for by in ("tenant", "tenant,model,day", "service,priority_class")]
    before = [usage.usage(rt, ADMIN, **a) for a in asks]  # type: ignore[arg-type]
    assert any(row.tenant == "t1" and row.device_hours > 0 for row in before[0].rows)
    delete_tenant(rt, ADMIN, "t1")
    with rt.store.read() as session:
        assert session.scalar(select(func.count()).select_from(PodRow).join(WorkloadRow).where(
            WorkloadRow.tenant == "t1")) == 0
        assert session.scalar(select(func.count()).select_from(RetiredPodRow)) > 0
    for ask, was in zip(asks, before, strict=True):
        _same(usage.usage(rt, ADMIN, **ask), was)  # type: ignore[arg-type]
        _same(metering.raw_usage(rt, ADMIN, **ask), was)  # type: ignore[arg-type]
    rt.book["now"] = _book(shift_s=-4 * 3600.0)  # type: ignore[attr-defined]
    assert rt.usage_rollup.fold(rt) > 0  # rebuilt, t1's kept intervals with the pods
    for ask, was in zip(asks, before, strict=True):
        now = usage.usage(rt, ADMIN, **ask)  # type: ignore[arg-type]
        _same(now, metering.raw_usage(rt, ADMIN, **ask))  # type: ignore[arg-type]
        assert [r.tenant for r in now.rows] == [r.tenant for r in was.rows]


GIB = 1024


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[LiveServer]:
    provider = ManualProvider([node("n0", devices=2, model="H100", device_memory_mib=80 * GIB)])
    config = parse_config("prices:\n  versions:\n    - devices: {H100: 4.0}\n")
    with live_server(tmp_path, provider, config=config) as server:
        yield server


def test_usage_keeps_its_model_after_the_node_leaves(srv: LiveServer) -> None:
    from gpupool.client import Client

    provider = srv.rt.provider
    assert isinstance(provider, ManualProvider) and isinstance(srv.rt.config, PoolConfig)
    with Client(srv.url, srv.admin_token) as pool:
        pool.create_tenant("team-a")
        wid = pool.submit({"command": ["true"], "tenant": "team-a", "resources": {"gpus": 0.5}})
        pod_id = provider.finish_the_one_launched(srv.rt.wake)
        done = pool.wait(wid, timeout_s=20)
        assert done.finished_s is not None
        with srv.rt.store.read() as session:
            row = session.get(PodRow, pod_id)
            assert row is not None and row.models == [{"model": "H100", "device_memory_mib": 80 * GIB,
                                                       "simulated": False}]
        provider._nodes = [node("n9", devices=1, model="A100")]  # n0 left the pool
        srv.rt.refresh_nodes()
        answer = pool.usage(since_s=done.submit_s - 1, until_s=done.finished_s + 1, by=["model"])
    [row_out] = answer.rows
    assert row_out.model == "H100" and row_out.priced and row_out.cost > 0


def test_the_rollup_digest_follows_the_prices_not_their_order() -> None:
    a = PriceBook((PriceVersion(0.0, {"h100": 4.0, "a100": 2.0}, None, {"x": 0.5, "y": 2.0}),))
    b = PriceBook((PriceVersion(0.0, {"a100": 2.0, "h100": 4.0}, None, {"y": 2.0, "x": 0.5}),))
    dearer = PriceBook((PriceVersion(0.0, {"a100": 2.5, "h100": 4.0}, None, {"y": 2.0, "x": 0.5}),))
    assert usage_rollup.digest(a, "normal") == usage_rollup.digest(b, "normal")
    assert usage_rollup.digest(a, "normal") != usage_rollup.digest(dearer, "normal")
    assert usage_rollup.digest(a, "normal") != usage_rollup.digest(a, "low")
