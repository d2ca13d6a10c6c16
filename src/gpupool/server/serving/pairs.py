"""What a replica of a prefill/decode pair is launched with (docs/services.md#prefilldecode-pairs):
its role, its partners' ready endpoints at launch, its HCAs and the service level of its class.

GPUPOOL_PARTNER_ENDPOINTS is a snapshot taken when the pod is launched (a pod's environment is fixed
at start); the partners' current endpoints are at GET /v1/services/{name}/partners
(`Client.service_partners`). Read in the launch's own transaction: no second connection is opened.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, select

from gpupool.core.model import WorkloadStatus
from gpupool.server.orm import ServiceReplicaRow, ServiceRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.rendezvous import node_hcas

ROLE_ENV = "GPUPOOL_SERVICE_ROLE"
PAIR_ENV = "GPUPOOL_PAIR_WITH"
PARTNERS_ENV = "GPUPOOL_PARTNER_ENDPOINTS"


def partner_endpoints(conn: Connection, tenant: str, partner: str) -> list[str]:
    """host:port of every ready, running replica of the tenant's service `partner`, sorted; [] when
    it does not exist (yet) or has none ready."""
    rows = conn.execute(
        select(ServiceReplicaRow.host, ServiceReplicaRow.port)
        .join(ServiceRow, ServiceRow.id == ServiceReplicaRow.service_id)
        .join(WorkloadRow, WorkloadRow.id == ServiceReplicaRow.workload_id)
        .where(ServiceRow.tenant == tenant, ServiceRow.name == partner, ServiceRow.state != "deleting",
               ServiceReplicaRow.ready == "ready", ServiceReplicaRow.host != "",
               WorkloadRow.status == WorkloadStatus.RUNNING.value))
    return sorted(f"{host}:{port}" for host, port in rows)


def pair_env(
    rt: Runtime, conn: Connection | None, tenant: str, spec: Mapping[str, Any], node: str
) -> dict[str, str]:
    """The variables of a paired replica's pod on `node` ({} for any other pod): GPUPOOL_SERVICE_ROLE,
    GPUPOOL_PAIR_WITH, GPUPOOL_PARTNER_ENDPOINTS, and where known NCCL_IB_HCA and UCX_NET_DEVICES
    (the node's adapters on the fabric, as a gang's pods get them) and NCCL_IB_SL (its class's)."""
    role, partner = spec.get("service_role"), spec.get("pair_with")
    if not role or not partner:
        return {}
    env = {ROLE_ENV: str(role), PAIR_ENV: str(partner)}
    env[PARTNERS_ENV] = ",".join(partner_endpoints(conn, tenant, str(partner))) if conn is not None else ""
    pool = rt.nodes()
    here = next((n for n in pool if n.name == node), None)
    if here is not None:
        live = rt.fabric
        hcas = node_hcas(here, [node]) if live is None else live.hcas(live.place_of(pool).get(node), here)
        if hcas:
            env["NCCL_IB_HCA"] = "=" + ",".join(hcas)  # '=': NCCL matches the names exactly
            env["UCX_NET_DEVICES"] = ",".join(hcas)
    sl = rt.config.fabric.service_level(str(spec.get("priority_class") or ""))
    if sl is not None:
        env["NCCL_IB_SL"] = str(sl)
    return env
