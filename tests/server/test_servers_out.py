"""`GET /servers` on servers sharing a store (`servers_out`): who leads, and a lease age that is never
negative, although the lease's holder may have renewed it by a clock a little ahead of this one."""

from __future__ import annotations

from gpupool.server.orm import LeaderLeaseRow, ServerRow
from gpupool.server.routers.servers import servers_out


def _rows() -> list[ServerRow]:
    return [ServerRow(id=name, address=f"127.0.0.1:{port}", version="1", started_s=1.0, seen_s=99.0)
            for name, port in (("a", 8001), ("b", 8002))]


def _lease(renewed_s: float, expires_s: float = 110.0) -> LeaderLeaseRow:
    return LeaderLeaseRow(id=1, holder="b", epoch=4, expires_s=expires_s, renewed_s=renewed_s,
                          acquired_s=50.0)


def test_the_holder_leads_first_with_its_epoch_and_lease_age() -> None:
    out = servers_out(_lease(renewed_s=97.5), _rows(), now=100.0, this_id="a")
    assert (out.leader, out.epoch, out.lease_expires_in_s) == ("b", 4, 10.0)
    assert [(s.id, s.leader, s.epoch, s.lease_age_s, s.this) for s in out.servers] == [
        ("b", True, 4, 2.5, False), ("a", False, None, None, True)]


def test_a_lease_renewed_by_a_clock_ahead_of_this_one_reads_as_just_renewed() -> None:
    out = servers_out(_lease(renewed_s=100.04), _rows(), now=100.0, this_id="a")
    age = out.servers[0].lease_age_s
    assert age == 0.0 and str(age) == "0.0"  # not -0.04, nor -0.0 (the overview prints "-0.0 s ago")


def test_an_expired_lease_names_no_leader() -> None:
    out = servers_out(_lease(renewed_s=80.0, expires_s=99.0), _rows(), now=100.0, this_id="a")
    assert out.leader is None
    assert not any(s.leader for s in out.servers)
    assert all(s.lease_age_s is None for s in out.servers)
