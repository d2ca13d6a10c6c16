"""The tail of new events that following streams share (server/services/event_tail.py): a page
from it is what the stream's own read of the table would have been, for every filter, and a cursor
behind the tail is sent to the table."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fakes import ManualProvider

from conftest import make_runtime
from factories import node
from gpupool.api.tenants import TenantCreate
from gpupool.api.workloads import WorkloadSpec
from gpupool.server.auth import Principal
from gpupool.server.services import event_stream, event_tail, tenants, workloads
from gpupool.server.services.event_stream import StreamFilter

ADMIN = Principal("admin", None)


def test_a_page_from_the_tail_is_the_tables_page_for_every_filter(tmp_path: Path, db_url: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """On SQLite and PostgreSQL (where a page also carries the ids present, for late commits)."""
    rt, _ = make_runtime(db_url, tmp_path,
                         ManualProvider([node("n0", devices=8, model="H100")]))
    try:
        tenants.create_tenant(rt, ADMIN, TenantCreate(name="team-a", unix_user=None))
        tail = event_tail.EventTail(rt, max_age_s=0.0)
        asyncio.run(tail.refresh())  # the tail starts at the newest event: none of those below
        ids = [workloads.submit(rt, ADMIN, WorkloadSpec.model_validate(
            {"command": ["true"], **({"tenant": "team-a"} if i % 2 else {})})).id for i in range(6)]
        for wid in ids[:3]:
            workloads.cancel(rt, ADMIN, wid)
        asyncio.run(tail.refresh())
        filters = [StreamFilter(None), StreamFilter("default"), StreamFilter("team-a"),
                   StreamFilter("team-a", (ids[1],)), StreamFilter(None, (ids[0], ids[5]))]
        newest = event_stream.newest_id(rt)
        for wanted in filters:
            for after in range(newest + 1):
                from_tail = tail.page(wanted, after)
                assert from_tail is not None
                from_table = event_stream.read_after(rt, wanted, after)
                assert ([e.id for e in from_tail.events], from_tail.scanned_to, from_tail.present) == (
                    [e.id for e in from_table.events], from_table.scanned_to, from_table.present), (
                    wanted, after)
        assert len(event_stream.read_after(rt, StreamFilter("team-a"), 0).events) == 4  # 3 submits, 1 cancel
        monkeypatch.setattr(event_tail, "RECENT", 2)  # the tail keeps only the newest two
        workloads.submit(rt, ADMIN, WorkloadSpec.model_validate({"command": ["true"]}))
        asyncio.run(tail.refresh())
        assert tail.page(StreamFilter(None), 0) is None  # behind the tail: read the table
        assert tail.page(StreamFilter(None), newest) is not None
    finally:
        rt.store.close()
