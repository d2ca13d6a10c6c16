"""The scheduler's kept view with the live fabric bound to it, so placements see link state."""

from __future__ import annotations

from gpupool.core.model import ClusterSnapshot
from gpupool.core.scheduling.cycle import Policies
from gpupool.core.scheduling.keeper import ViewKeeper
from gpupool.core.scheduling.view import ClusterView
from gpupool.server.runtime import Runtime


class FabricKeeper(ViewKeeper):
    """A ViewKeeper whose view is bound, every cycle, to the runtime's fabric (`LiveFabric.view_for`:
    the link changes queued since the last cycle are applied here, in the loop's thread), and
    handed the telemetry's latest congestion sample for the cycle to judge."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__()
        self.rt = rt

    def sync(self, snapshot: ClusterSnapshot, policies: Policies) -> ClusterView:
        view = super().sync(snapshot, policies)
        fabric = self.rt.fabric
        topology = None if fabric is None else fabric.view_for(snapshot.nodes)
        if view.topology is not topology:
            if topology is not None:  # a view built afresh: it puts the gangs running now back
                for gang in list(topology.gangs):
                    topology.remove_gang(gang)
            view.set_topology(topology)
        sample = fabric.take_congestion_sample() if fabric is not None else None
        if sample is not None:  # judged by this cycle (`Policies.migrate`)
            view.congestion_sample = sample
        return view
