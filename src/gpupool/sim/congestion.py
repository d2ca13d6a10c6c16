"""Congestion in the replay: telemetry from the communication model's truth, and moving gangs off
congested links (`fabric.migrate_on_congestion` of the live server, measured here).

Every `sample_s` while multi-node gangs run, `CongestionWatch.sample` reads each link pool's
utilisation from the truth (`CommTracker.pool_utilisation`: carried Gb/s over available Gb/s) and,
like the server's telemetry route, sets it as the load of that pool's links in the scheduler's
view (`FabricView.set_link(key, utilization=...)`): the network-aware policy then sees measured
load, and a link at `LinkHealth.load_high` is penalised until its load falls (hysteresis). A pool
keeps being sampled while one of its links is penalised, so the hysteresis can let go; sampling
stops once no gang runs and nothing is penalised. With `Policies.migrate`, each sample's bottleneck
loads (`CommTracker.bottleneck_utilisation`) go to the cycle, which stops a gang whose bottleneck
stays above the threshold for the hold time (kind migrate: the rule the server's cycle applies,
`core.scheduling.congestion.MigrateRule`); the replay checkpoint-requeues it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpupool.errors import InvalidInput

if TYPE_CHECKING:
    from gpupool.core.scheduling.topology import FabricView
    from gpupool.sim.comm_net import CommTracker


@dataclass(frozen=True, slots=True)
class CongestionRule:
    """When the replay samples link load (telemetry). Whether gangs move off congested links, and
    when, is the cycle's (`Policies.migrate`: the configuration's fabric.migrate_on_congestion,
    congestion_threshold and congestion_for, as `gpupool up` reads them)."""

    sample_s: float = 60.0
    """Telemetry period."""

    def __post_init__(self) -> None:
        if not 0 < self.sample_s < math.inf:
            raise InvalidInput(f"The congestion sample period must be a finite number of seconds > 0, got "
                               f"{self.sample_s}.")


@dataclass
class CongestionWatch:
    """The replay's telemetry, and its account of the gangs the cycle moved (see the module docstring)."""

    rule: CongestionRule
    reported: set[tuple[int, int]] = field(default_factory=set)
    """Pools whose load the scheduler's view holds non-zero or penalised: sampled until they clear."""
    samples: int = 0
    moves: int = 0
    lost_device_s: float = 0.0
    moved_from: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Moved gang -> the nodes it left, until it starts again."""
    same_nodes: int = 0
    """Moved gangs placed again on exactly the nodes they left."""

    def sample(self, truth: CommTracker, topology: FabricView | None, now_s: float) -> dict[str, float]:
        """One telemetry sample: the measured load set in the view; returns each tracked gang's
        bottleneck utilisation (`CommTracker.bottleneck_utilisation`), what the cycle judges."""
        self.samples += 1
        pools = truth.pool_utilisation()
        if topology is not None:
            self._telemetry(truth, topology, pools)
        return truth.bottleneck_utilisation(pools)

    def active(self, truth: CommTracker) -> bool:
        """Whether the next sample is needed: gangs run, or the view still holds load to clear."""
        return bool(truth.gangs) or bool(self.reported)

    def moved(self, wid: str, nodes: tuple[int, ...], lost_device_s: float) -> None:
        self.moves += 1
        self.lost_device_s += lost_device_s
        self.moved_from[wid] = nodes

    def restarted(self, wid: str, nodes: tuple[int, ...]) -> None:
        left = self.moved_from.pop(wid, None)
        if left is not None and left == nodes:
            self.same_nodes += 1

    def report(self) -> dict[str, float | int]:
        return {
            "congestion_samples": self.samples,
            "congestion_moves": self.moves,
            "congestion_lost_gpu_h": self.lost_device_s / 3600.0,
            "congestion_same_nodes": self.same_nodes,
        }

    def _telemetry(self, truth: CommTracker, topology: FabricView,
                   pools: dict[tuple[int, int], float]) -> None:
        keep: set[tuple[int, int]] = set()
        for pool in sorted(set(pools) | self.reported):
            load = min(1.0, pools.get(pool, 0.0))
            penalised = False
            for key in truth.pool_links(pool):
                topology.set_link(key, utilization=load)
                state = topology.link_state(key)
                penalised = penalised or (state is not None and state[2])
            if load > 0 or penalised:
                keep.add(pool)
        self.reported = keep
