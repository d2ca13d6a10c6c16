"""What a running server shares between its routes, services and loops: store, provider, clock."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from gpupool.config import PoolConfig
from gpupool.core.model import Node, Workload
from gpupool.providers.base import Provider
from gpupool.server.auth import Authenticator
from gpupool.server.db import Store
from gpupool.server.held import HeldPods
from gpupool.server.images import ImageStore
from gpupool.server.ratelimit import Slots, TenantRates
from gpupool.server.settings import Settings

if TYPE_CHECKING:
    from gpupool.server.loops.launches import LaunchWorkers
    from gpupool.server.services.budgets import BudgetTracker
    from gpupool.server.services.fabric import LiveFabric
    from gpupool.server.services.usage_rollup import UsageRollup

MAX_HANDED_OVER = 100_000
CHECKPOINT_TRANSFERS, CHECKPOINT_TRANSFERS_PER_TENANT = 2, 1
"""Checkpoint archives read or written at once, in all and for one tenant (each up to 256 MiB, held
twice in the server's memory): a tenant's 40 reads at once asked the server for 20 GiB."""


@dataclass
class Runtime:
    """The long-lived objects of one server process."""

    settings: Settings
    store: Store
    provider: Provider
    clock: Callable[[], float] = time.time
    config: PoolConfig = field(default_factory=PoolConfig)
    """The scheduling configuration (`gpupool up --config`; the defaults without one)."""
    wake: threading.Event = field(default_factory=threading.Event)
    capacity_changed: threading.Event = field(default_factory=threading.Event)
    """Set when room may have appeared (cancel, uncordon, quota change): re-examine all pending work."""
    dependencies_changed: threading.Event = field(default_factory=threading.Event)
    """Set when work waiting on a dependency was submitted: the loop judges the waiting work again."""
    submitted: collections.deque[Workload] = field(
        default_factory=lambda: collections.deque(maxlen=MAX_HANDED_OVER))
    """Core Workloads of just-committed submissions, parsed by the API: the scheduler takes them
    instead of parsing their stored specs again (anything missing here is parsed from the store)."""
    left_pending: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=MAX_HANDED_OVER))
    """Ids of pending work the API has just taken out of pending (cancelled, held), committed: the
    scheduler's kept queue drops them (one missed is found by its next full read)."""
    held: HeldPods = field(default_factory=HeldPods)
    """What the active pods hold, as last read by any route (each read brings it up to date)."""
    budgets: BudgetTracker = field(default_factory=lambda: _budget_tracker())
    """Each budgeted tenant's spend this period and who exhausted theirs (services/budgets.py)."""
    usage_rollup: UsageRollup = field(default_factory=lambda: _usage_rollup())
    """The daily usage rollup's keeper (services/usage_rollup.py): folded by the control loop."""
    fabric: LiveFabric | None = None
    """The IB fabric the pool runs on (`gpupool up --fabric FILE`): link state, routes and the
    scheduler's view of it (services/fabric.py); None: no fabric known, placement as before."""
    launches: LaunchWorkers | None = None
    """The nodes' launch workers, set by the control loop's scheduler (loops/launches.py): a cancel
    takes back the launches no worker has begun, so their pods end at once."""
    _images: ImageStore | None = None
    _nodes: tuple[Node, ...] = ()
    _nodes_lock: threading.Lock = field(default_factory=threading.Lock)
    auth: Authenticator = field(init=False)
    tenant_rates: TenantRates = field(init=False)
    """Each tenant's requests to the API, bounded (server/ratelimit.py)."""
    checkpoint_transfers: Slots = field(default_factory=lambda: Slots(
        CHECKPOINT_TRANSFERS, CHECKPOINT_TRANSFERS_PER_TENANT, "checkpoint transfers"))
    """GET and PUT /workloads/ID/checkpoint hold the archive in memory: at most this many at once."""

    def __post_init__(self) -> None:
        self.auth = Authenticator(self.store, clock=lambda: self.clock())  # expiry on this clock
        self.tenant_rates = TenantRates(self.settings.tenant_request_rate,
                                        open_requests=self.settings.tenant_open_requests)

    def refresh_nodes(self) -> tuple[Node, ...]:
        """Ask the provider (non-blocking by contract) and keep the answer for readers."""
        nodes = tuple(self.provider.nodes())
        if nodes == self._nodes:
            return self._nodes  # the same objects: readers then compare them by identity, cheaply
        with self._nodes_lock:
            self._nodes = nodes
        return nodes

    def nodes(self) -> tuple[Node, ...]:
        """The nodes last seen from the provider (refreshed by the loop), fetched once if empty."""
        with self._nodes_lock:
            nodes = self._nodes
        return nodes or self.refresh_nodes()

    @property
    def images(self) -> ImageStore:
        """The pool's image store (server/images.py), opened at first use."""
        with self._nodes_lock:
            if self._images is None:
                self._images = ImageStore(self.settings.resolved_image_dir)
            return self._images

    def capacity_may_have_changed(self) -> None:
        self.capacity_changed.set()
        self.wake.set()

    @property
    def simulated(self) -> bool:
        return any(d.simulated for n in self.nodes() for d in n.devices)


def _budget_tracker() -> BudgetTracker:
    from gpupool.server.services.budgets import BudgetTracker  # it reads the store through a Runtime

    return BudgetTracker()


def _usage_rollup() -> UsageRollup:
    from gpupool.server.services.usage_rollup import UsageRollup  # it reads the store through a Runtime

    return UsageRollup()


def with_flags(node: Node, cordoned: bool) -> Node:
    return replace(node, cordoned=node.cordoned or cordoned)
