"""Where a gang meets: MASTER_ADDR (the rank-0 pod's own address where pods have network namespaces,
else its node's), a MASTER_PORT reserved on that node,
the local ranks, and NCCL's IB settings (HCAs, service level, partition) for every pod it launches.
The port comes from the pool's gang range (`gangs.port_base`, `port_count`; config.py).

A port is held by one attempt of one workload from its admission until its rank-0 pod has ended
(stopping counts: the old process may still hold the socket). The reservation is written into the
workload's stored spec (`rendezvous`, newest last), so the book is rebuilt from the store after a
restart and two gangs never get the same port on one node.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select, update

from gpupool.core.model import Node
from gpupool.errors import Unavailable
from gpupool.server.orm import Base
from gpupool.server.runtime import Runtime
from gpupool.server.states import ACTIVE_POD_STATES, PodState

KEPT = 4
"""Reservations of earlier attempts kept in the spec (an attempt's pods may still be stopping)."""
HOLDING = (*ACTIVE_POD_STATES, PodState.STOPPING.value)
_W = Base.metadata.tables["workloads"]
_P = Base.metadata.tables["pods"]

HcaChooser = Callable[[Node, Sequence[str]], tuple[str, ...]]
"""(node, the gang's nodes) -> its HCAs for NCCL_IB_HCA ("mlx5_0:1")."""


@dataclass(frozen=True, slots=True)
class Gang:
    """What every pod of one admitted multi-pod workload is launched with."""

    master_node: str
    master_addr: str
    master_port: int
    nodes: Mapping[int, str]
    """rank -> node."""
    hcas: Mapping[str, tuple[str, ...]]
    ib_sl: int | None = None
    ib_pkey_index: int | None = None

    def launch_fields(self, rank: int) -> dict[str, Any]:
        """The PodLaunch fields of rank `rank`: its local rank among the pods on its node, and so on."""
        node = self.nodes[rank]
        here = sorted(r for r, n in self.nodes.items() if n == node)
        return {"local_rank": here.index(rank), "local_world_size": len(here),
                "master_addr": self.master_addr, "master_port": self.master_port,
                "ib_hcas": self.hcas.get(node, ()), "ib_sl": self.ib_sl, "ib_pkey_index": self.ib_pkey_index}


def node_hcas(node: Node, gang_nodes: Sequence[str]) -> tuple[str, ...]:
    """Every active IB port the node's agent probed, as NCCL names them (device:port), sorted.
    Without a fabric this is all a node can offer; a known fabric narrows it to the adapters whose
    cable works (`LiveFabric.hcas`)."""
    ports = [p for p in node.ib_ports if p.state.upper() in ("", "ACTIVE", "4: ACTIVE")]
    return tuple(sorted({f"{p.hca}:{p.port}" for p in ports}))


def first_port(workload_id: str, ports: range) -> int:
    """Where the search for a workload's port in `ports` starts: spread by its id, so that gangs of
    pools sharing a machine (and a range) rarely try the same port first."""
    return ports.start + zlib.crc32(workload_id.encode()) % len(ports)


class PortBook:
    """The gang ports held on each node: (workload, attempt) -> (node, port)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], tuple[str, int]] | None = None

    def reserve(self, conn: Connection, workload_id: str, attempt: int, node: str, ports: range) -> int:
        """A port of `ports` (the pool's gang range) on `node` no gang holds, tried from a point drawn
        from the workload's id (so concurrent pools rarely start from the same one). Raises
        Unavailable when all are held."""
        held = self._current(conn)
        used = {port for where, port in held.values() if where == node}
        start = first_port(workload_id, ports) - ports.start
        for step in range(len(ports)):
            port = ports[(start + step) % len(ports)]
            if port not in used:
                held[(workload_id, attempt)] = (node, port)
                return port
        raise Unavailable(f"Every gang port of node {node} ({ports.start}-{ports.stop - 1}, gangs.port_base "
                          "and port_count) is held; wait for a gang there to end.")

    def held(self, conn: Connection) -> dict[tuple[str, int], tuple[str, int]]:
        """Every reservation still held (for tests and `gpupool show`)."""
        return dict(self._current(conn))

    def _current(self, conn: Connection) -> dict[tuple[str, int], tuple[str, int]]:
        if self._held is None:
            self._held = _from_store(conn)
            return self._held
        if self._held:  # drop what ended: only the holders' rank-0 pods are read
            ids = {wid for wid, _ in self._held}
            query = select(_P.c.workload_id, _P.c.attempt).where(
                _P.c.workload_id.in_(ids), _P.c.rank == 0, _P.c.status.in_(HOLDING))
            live = {(wid, attempt) for wid, attempt in conn.execute(query)}
            self._held = {key: value for key, value in self._held.items() if key in live}
        return self._held


def _from_store(conn: Connection) -> dict[tuple[str, int], tuple[str, int]]:
    """The reservations of every attempt whose rank-0 pod still holds its slices or is stopping."""
    held: dict[tuple[str, int], tuple[str, int]] = {}
    rows = conn.execute(select(_P.c.workload_id, _P.c.attempt, _W.c.spec)
                        .join(_W, _W.c.id == _P.c.workload_id)
                        .where(_P.c.rank == 0, _P.c.status.in_(HOLDING)))
    for workload_id, attempt, spec in rows:
        for entry in spec.get("rendezvous") or ():
            if entry.get("attempt") == attempt:
                held[(workload_id, attempt)] = (str(entry["node"]), int(entry["port"]))
    return held


def plan(rt: Runtime, conn: Connection, book: PortBook, row: Any, attempt: int, nodes: Mapping[int, str],
         hcas: HcaChooser | None = None) -> Gang:
    """Reserve the gang's port on its rank-0 node and record it in the workload's spec (in the
    caller's transaction); `row` has id, tenant and spec."""
    master = nodes[0]
    port = book.reserve(conn, row.id, attempt, master, rt.config.gangs.ports())
    addr = rt.provider.gang_address(master, port)
    entry = {"attempt": attempt, "node": master, "addr": addr, "port": port}
    kept = [e for e in row.spec.get("rendezvous") or () if e.get("attempt") != attempt][-(KEPT - 1):]
    conn.execute(update(_W).where(_W.c.id == row.id).values(spec={**row.spec, "rendezvous": [*kept, entry]}))
    return _gang(rt, row, entry, nodes, hcas)


def recorded(rt: Runtime, row: Any, attempt: int, nodes: Mapping[int, str],
             hcas: HcaChooser | None = None) -> Gang | None:
    """The gang as planned at its admission (its pods were launched later: they waited for a
    stopping pod's device); None when it has no reservation (a single pod)."""
    entry = next((e for e in reversed(row.spec.get("rendezvous") or ()) if e.get("attempt") == attempt), None)
    return None if entry is None else _gang(rt, row, entry, nodes, hcas)


def _gang(rt: Runtime, row: Any, entry: Mapping[str, Any], nodes: Mapping[int, str],
          hcas: HcaChooser | None) -> Gang:
    pool = rt.nodes()
    if hcas is None:
        live = rt.fabric
        places = {} if live is None else live.place_of(pool)
        hcas = node_hcas if live is None else (lambda node, _: live.hcas(places.get(node.name), node))
    by_name = {n.name: n for n in pool}
    gang_nodes = sorted(set(nodes.values()))
    chosen = {name: hcas(by_name[name], gang_nodes) for name in gang_nodes if name in by_name}
    fabric = rt.config.fabric
    return Gang(master_node=str(entry["node"]), master_addr=str(entry["addr"]),
                master_port=int(entry["port"]), nodes=dict(nodes), hcas=chosen,
                ib_sl=fabric.service_level(str(row.spec.get("priority_class") or "")),
                ib_pkey_index=fabric.pkey_index(row.tenant))
