"""What the dashboard's history costs at 1,000 nodes x 8 devices: store bytes per day, and the time of a
minute's sample, of an hour's roll-up and of the dashboard's reads (services/history.py).

    .venv/bin/python bench/history_cost.py [--nodes 1000] [--minutes 120] [--tenants 50] \
        [--backend sqlite|postgresql]

A server runtime over the fake provider (`--nodes` x 8 H100) and the store (the embedded SQLite, or
a throw-away PostgreSQL with `--backend postgresql`: the table's size with its index) records
`--minutes` minutes (whole hours, more than a day old), each one sample of the pool plus `--tenants`
tenants' rows, every device measured (as NVML would: utilisation and memory, the larger rows). The
store's size is read before and after (pages in use), the minutes are rolled up into hours, and the
store read again; from these: a day at minute resolution (kept one day), a rolled-up day (kept for
the retention) and the steady state at 30 days. The last hour is then copied into a week of hours,
for the time of each device's means over a day and a week (read from hourly rows). The API's cost
beside the commit before is `bench/side_by_side.py ... -- bench/api_load.py`
(docs/experiments/dashboard.md).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from sqlalchemy import text

from _control_plane import write_json
from gpupool.core.metering import DAY_S
from gpupool.providers.fake import FakeProvider
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.runtime import Runtime
from gpupool.server.services import history
from gpupool.server.services.history import HOUR_S, MINUTE_S, Point
from gpupool.server.settings import Settings

ADMIN = Principal("admin", None)
START = 1_796_083_200.0  # a UTC midnight


def _bytes(rt: Runtime) -> int:
    if rt.store.engine.dialect.name == "postgresql":
        with rt.store.engine.connect() as conn:
            return int(conn.execute(text("SELECT pg_total_relation_size('history')")).scalar_one())
    with rt.store.engine.connect() as conn:
        conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        pages = conn.execute(text("PRAGMA page_count")).scalar_one()
        free = conn.execute(text("PRAGMA freelist_count")).scalar_one()
        size = conn.execute(text("PRAGMA page_size")).scalar_one()
    return int((pages - free) * size)


def _points(rt: Runtime, tenants: int, minute: int) -> list[Point]:
    """One sample of the pool, with every device measured and `tenants` tenants holding devices."""
    points = []
    for p in history.sample(rt):
        if p.series == "device":
            busy = float((hash(p.key) + minute) % 100)
            p = Point("device", p.key, 500.0, busy, 40_000.0 + busy)
        points.append(p)
    return points + [Point("tenant", f"tenant-{t:03d}", 1000.0 * (t % 7)) for t in range(tenants)]


def measure(nodes: int, minutes: int, tenants: int, data_dir: Path, url: str = "") -> dict[str, object]:
    url = url or f"sqlite:///{data_dir / 'store.sqlite'}"
    rt = Runtime(settings=Settings(data_dir=data_dir, database_url=url), store=Store.open(url),
                 provider=FakeProvider(f"{nodes}x8xH100"))
    first = START
    empty = _bytes(rt)
    sample_ms, write_ms = [], []
    rows = 0
    for m in range(minutes):
        began = time.perf_counter()
        points = _points(rt, tenants, m)
        sampled = time.perf_counter()
        rows += history.record(rt, first + m * MINUTE_S, points)
        sample_ms.append((sampled - began) * 1000)
        write_ms.append((time.perf_counter() - sampled) * 1000)
    minute_bytes = (_bytes(rt) - empty) / minutes
    now = first + minutes * MINUTE_S
    reads = {}
    for metric, range_ in (("devices", "1h"), ("allocation", "24h"), ("tenants", "24h")):
        began = time.perf_counter()
        history.query(rt, ADMIN, metric, range_, now)
        reads[f"{metric}_{range_}_ms"] = round((time.perf_counter() - began) * 1000, 1)
    began = time.perf_counter()
    hours = history.roll_up(rt, first + minutes * MINUTE_S + DAY_S + HOUR_S)
    rollup_ms = (time.perf_counter() - began) * 1000 / max(hours, 1)
    if rt.store.engine.dialect.name == "postgresql":  # VACUUM FULL: the deleted minutes' space returned
        with rt.store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM FULL history"))
    else:
        with rt.store.engine.connect() as conn:
            conn.execute(text("VACUUM"))
    hour_bytes = (_bytes(rt) - empty) / max(hours, 1)
    # a week of hours, copied from the last one rolled up, for the reads of each device's means
    last_hour = first + (hours - 1) * HOUR_S
    with rt.store.engine.begin() as conn:
        for k in range(1, 7 * 24 - hours + 1):
            conn.execute(text("INSERT INTO history SELECT series, step_s, at_s + :shift, key, value, "
                              "busy_pct, memory_mib FROM history WHERE step_s = :hour AND at_s = :at"),
                         {"shift": k * HOUR_S, "hour": HOUR_S, "at": last_hour})
    week_end = last_hour + (7 * 24 - hours + 1) * HOUR_S
    for range_ in ("24h", "7d"):
        began = time.perf_counter()
        history.query(rt, ADMIN, "devices", range_, week_end)
        reads[f"devices_{range_}_ms"] = round((time.perf_counter() - began) * 1000, 1)
    rt.store.close()
    day_minutes_mb = minute_bytes * 1440 / 2**20
    day_hours_mb = hour_bytes * 24 / 2**20
    return {
        "backend": rt.store.engine.dialect.name, "nodes": nodes, "devices": nodes * 8, "tenants": tenants,
        "minutes": minutes,
        "rows_per_minute": rows // minutes, "hours_rolled_up": hours,
        "sample_ms_median": round(statistics.median(sample_ms), 1),
        "write_ms_median": round(statistics.median(write_ms), 1),
        "rollup_ms_per_hour": round(rollup_ms, 1),
        "bytes_per_minute": round(minute_bytes), "bytes_per_rolled_hour": round(hour_bytes),
        "day_at_minutes_mib": round(day_minutes_mb, 1), "day_rolled_up_mib": round(day_hours_mb, 2),
        "steady_state_30d_mib": round(day_minutes_mb + 30 * day_hours_mb, 1),  # hours: the last day too
        "sampler_share_of_a_core": round((statistics.median(sample_ms) + statistics.median(write_ms)
                                          + rollup_ms / 60) / (MINUTE_S * 1000), 5),
        **reads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--minutes", type=int, default=120, help="whole hours of minutes to write")
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--json", default="")
    opts = parser.parse_args()
    if opts.minutes < 60 or opts.minutes % 60:
        raise SystemExit(f"--minutes must be whole hours (60, 120, ...), got {opts.minutes}")
    pg = None
    if opts.backend == "postgresql":
        from gpupool.server import pgtemp

        reason = pgtemp.why_unavailable()
        if reason:
            raise SystemExit(f"PostgreSQL cannot be started here: {reason}")
        pg = pgtemp.start(fsync=True)
    try:
        with tempfile.TemporaryDirectory(prefix="gpupool-history-") as tmp:
            result = measure(opts.nodes, opts.minutes, opts.tenants, Path(tmp),
                             pg.create_database() if pg else "")
    finally:
        if pg is not None:
            pg.stop()
    table = Table(title=f"history cost at {result['nodes']} nodes x 8 devices, {result['backend']}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, str(value))
    Console().print(table)
    print(f"JSON: {write_json(opts.json, f'history_cost_{opts.backend}', result)}")


if __name__ == "__main__":
    main()
