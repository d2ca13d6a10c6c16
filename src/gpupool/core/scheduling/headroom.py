"""Serving headroom: room kept free from new batch admission so that inference services can grow
without waiting for a preemption (the pool's `serving.headroom_replicas`).

The room is counted in replicas of one shape, the largest service's: how many such pods the free
capacity of the schedulable devices could still take (fractional slices by free compute per device,
whole devices by fully free devices per node). A workload of an exempt class (the services' own)
may use the room; any other is admitted only if the room stays at least `replicas` afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from gpupool.core.state import ClusterState
from gpupool.core.units import MILLI


@dataclass(frozen=True, slots=True)
class Headroom:
    replicas: int
    """How many more replicas must still fit after a batch admission."""
    num_devices: int
    device_milli: int
    """The replica's shape: whole devices (num_devices, 1000) or one slice (1, milli < 1000)."""
    exempt_classes: frozenset[str] = frozenset()
    """Priority classes the room is kept for (they may use it)."""

    def applies_to(self, priority_class: str) -> bool:
        return self.replicas > 0 and self.device_milli > 0 and priority_class not in self.exempt_classes


def room(state: ClusterState, num_devices: int, device_milli: int) -> int:
    """How many pods of the shape the free capacity could still take (host resources not counted)."""
    usable = state.dev_valid & state.schedulable[:, None]
    if device_milli < MILLI:
        per_device = np.where(usable, state.dev_milli_free // max(device_milli, 1), 0)
        return int(per_device.sum())
    whole = usable & (state.dev_milli_free == MILLI) & (state.dev_milli_cap == MILLI)
    return int((whole.sum(axis=1) // max(num_devices, 1)).sum())


def keeps(headroom: Headroom, state: ClusterState) -> bool:
    """Whether the state (after a tentative admission) still has the room."""
    return room(state, headroom.num_devices, headroom.device_milli) >= headroom.replicas


def refusal(headroom: Headroom) -> str:
    share = (f"{headroom.device_milli / MILLI:g} of a device" if headroom.device_milli < MILLI
             else f"{headroom.num_devices} device(s)")
    return (f"Starting it would leave less room than the pool keeps for its services "
            f"(serving.headroom_replicas: {headroom.replicas} replica(s) of {share}).")


def for_services(replicas: int, shapes: Iterable[tuple[int, int]],
                 exempt_classes: Iterable[str]) -> Headroom | None:
    """The headroom for `replicas` more replicas of the largest of the services' replica shapes
    ((num_devices, device_milli) each), as the pool keeps it (`serving.headroom_replicas`) and the
    replay (sim/colocation.py) does; None when it keeps none or no service asks for devices."""
    largest = max(shapes, key=lambda s: s[0] * s[1], default=(0, 0))
    if replicas <= 0 or largest[1] <= 0:
        return None
    return Headroom(replicas, largest[0], largest[1], frozenset(exempt_classes))
