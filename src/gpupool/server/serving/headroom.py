"""The headroom the scheduler keeps for services (`serving.headroom_replicas`): room for N more
replicas of the largest service's slice, read from the store at each cycle where the pool keeps
headroom (one small query; none where it keeps none)."""

from __future__ import annotations

from sqlalchemy import select

from gpupool.core.scheduling.headroom import Headroom, for_services
from gpupool.core.units import MILLI
from gpupool.server.orm import ServiceRow
from gpupool.server.runtime import Runtime


def replica_shape(spec: dict[str, object]) -> tuple[int, int]:
    """(num_devices, device_milli) of one replica of a stored service spec."""
    resources = spec.get("resources")
    gpus = float(resources.get("gpus", 0) or 0) if isinstance(resources, dict) else 0.0
    if gpus <= 0:
        return 0, 0
    if gpus < 1:
        return 1, max(1, round(gpus * MILLI))
    return int(gpus), MILLI


class HeadroomBook:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def current(self) -> Headroom | None:
        """The headroom to keep now; None when the pool keeps none or has no service with devices."""
        serving = self.rt.config.serving
        if serving.headroom_replicas <= 0:
            return None
        with self.rt.store.read() as session:
            specs = list(session.scalars(select(ServiceRow.spec)))
        exempt = {serving.priority_class, *(c.name for c in serving.classes)}
        return for_services(serving.headroom_replicas, (replica_shape(spec) for spec in specs), exempt)
