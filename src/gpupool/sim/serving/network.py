"""KV-cache transfers as flows on the fabric's link pools, beside training gangs' all-reduce traffic.

A flow from node a to node b uses the link pools of the path model (`FabricView`): both nodes' HCA
links, both leaves' uplinks when they differ, both spine groups' uplinks when those differ. The
pools' Gb/s are divided max-min fairly (progressive filling: every flow's rate grows together until
a pool is full; the flows on it are frozen at that rate and the rest grow on), re-rated whenever a
flow starts or ends. A flow held back elsewhere leaves its unused share of a pool to the others,
which an equal split of each pool would waste. A training gang is a persistent flow on every pool
its ring crosses: it takes its share all the time (the all-reduce of a data-parallel job runs every
step), and its slowdown is the step time at its rate over the step time at the rate it had with no
KV flow beside it.

`rails` > 1 models hosts with that many HCAs on as many parallel planes of the same fabric (a
rail-optimised DGX cluster: 8 rails, each a copy of the tree): every pool carries `rails` times its
Gb/s, and every flow (a tensor-parallel instance's KV shards, a gang's all-reduce) is striped
across all the rails.

Without a fabric every node has one pool of `nic_gbps` x `rails` (its HCA links) and nothing else
is shared.

`routing` says which switch-to-switch links a flow crosses. `pooled` (the model above, the earlier
rounds' figures): a leaf's uplinks are one pool, as if every flow were spread over all of them
(perfect multipath). `static` (the serving runs' default): what an InfiniBand subnet manager
programs. OpenSM's up*/down* and ftree engines write linear forwarding tables, one output port per
destination LID at every switch, so all traffic between two hosts takes one fixed path; the path
here is the one the project's own up*/down* tables give (`core.fabric.forwarding.compute_tables`
and `walk`), and each switch-to-switch cable, one pool per direction (IB links are full duplex), is
shared max-min fairly by the flows routed onto it. The HCA links stay one pool a host in both
models. A training gang's ring all-reduce is one entity on every cable of its ring's hops (node i
to node i+1 in index order, the last back to the first), counted once per cable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpupool.core.fabric.forwarding import ForwardingTables, compute_tables, walk
from gpupool.core.fabric.model import Fabric
from gpupool.core.scheduling.topology import ACCESS, LEAF_UP, SPINE_UP, FabricView
from gpupool.errors import InvalidInput

Pool = tuple[int, int]
DEFAULT_NIC_GBPS = 400.0
CABLE = 3
"""Pool kind of one direction of one switch-to-switch cable (static routing): (CABLE, edge index in
the forwarding tables' switch arrays)."""
ROUTINGS = ("static", "pooled")


@dataclass(frozen=True, slots=True)
class TrainingSpec:
    """A data-parallel training gang beside the service: one ring all-reduce of `gradient_gib` per
    step of `compute_s` (no overlap), over `nodes_per_gang` whole nodes."""

    gangs: int = 0
    nodes_per_gang: int = 4
    gradient_gib: float = 4.0
    compute_s: float = 1.0


@dataclass(slots=True)
class _Flow:
    pools: tuple[Pool, ...]
    remaining: float
    rate_bps: float = 0.0
    cross_leaf: bool = False
    cross_spine: bool = False


@dataclass(slots=True)
class _Train:
    nodes: tuple[int, ...]
    pools: tuple[Pool, ...]
    alone_step_s: float = 0.0
    slow_integral: float = 0.0
    gbps_now: float = 0.0
    slow_now: float = 1.0


@dataclass(slots=True)
class KVNetwork:
    """Flows on link pools (see the module docstring); times in seconds, sizes in bytes."""

    view: FabricView | None
    nic_gbps: float = DEFAULT_NIC_GBPS
    training: TrainingSpec = field(default_factory=TrainingSpec)
    rails: int = 1
    fabric: Fabric | None = None
    """The fabric `view` was built from: needed by `routing="static"` (its forwarding tables)."""
    routing: str = "pooled"
    """`pooled` or `static` (see the module docstring; `ServeOptions` defaults to static)."""
    flows: dict[int, _Flow] = field(default_factory=dict)
    count: dict[Pool, int] = field(default_factory=dict)
    trains: list[_Train] = field(default_factory=list)
    last_s: float = 0.0
    cross_leaf_bytes: float = 0.0
    cross_spine_bytes: float = 0.0
    kv_bytes: float = 0.0
    util_integral: dict[Pool, float] = field(default_factory=dict)
    util_peak: dict[Pool, float] = field(default_factory=dict)
    version: int = 0
    _cap: dict[Pool, float] = field(default_factory=dict)
    _util_now: dict[Pool, float] = field(default_factory=dict)
    _on_pool: dict[Pool, set[int]] = field(default_factory=dict)
    """Who is on each pool: flow ids (>= 0) and training gangs (-1 - index)."""
    _tables: ForwardingTables | None = None
    _edge: dict[tuple[int, int], int] = field(default_factory=dict)
    _routes: dict[tuple[int, int], tuple[Pool, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.routing not in ROUTINGS:
            raise InvalidInput(f"Unknown routing {self.routing!r}; use static or pooled.")
        if self.routing == "static" and self.view is not None:
            if self.fabric is None:
                raise InvalidInput("Static routing needs the fabric the view was built from.")
            self._tables = compute_tables(self.fabric)
            arrays = self._tables.arrays
            ends = zip(arrays.src.tolist(), arrays.port.tolist(), strict=True)
            self._edge = {end: e for e, end in enumerate(ends)}

    def route_cables(self, a: int, b: int) -> tuple[Pool, ...]:
        """The cables (one direction each) the forwarding tables send traffic from node a to node b
        over, in order; () on one leaf, with pooled routing, or without a fabric."""
        tables, view = self._tables, self.view
        if tables is None or view is None or a == b:
            return ()
        key = (a, b)
        cached = self._routes.get(key)
        if cached is None:
            src, dst = view.places[a], view.places[b]
            if src is None or dst is None:
                return ()
            assert self.fabric is not None
            hops = walk(self.fabric, tables, src.ports[0].ca, dst.ports[0].ca)
            if not hops:
                raise InvalidInput(f"The forwarding tables have no route from node {a} to node {b}.")
            index = tables.arrays.index
            cached = tuple((CABLE, self._edge[(index[sw], port)]) for sw, port in hops[:-1])
            self._routes[key] = cached
        return cached

    # ------------------------------------------------------------------ paths

    def path(self, a: int, b: int) -> tuple[tuple[Pool, ...], bool, bool]:
        """The pools a flow from node a to node b crosses, and whether it crosses leaves / spines."""
        if a == b:
            return (), False, False
        pools: list[Pool] = [(ACCESS, a), (ACCESS, b)]
        view = self.view
        if view is None:
            return tuple(pools), False, False
        la, lb = int(view.leaf_id[a]), int(view.leaf_id[b])
        cross_leaf = la != lb
        cross_spine = False
        if cross_leaf:
            sa, sb = int(view.spine_id[a]), int(view.spine_id[b])
            cross_spine = sa != sb
            if self._tables is not None:
                pools += self.route_cables(a, b)
            else:
                pools += [(LEAF_UP, la), (LEAF_UP, lb)]
                if cross_spine:
                    pools += [(SPINE_UP, sa), (SPINE_UP, sb)]
        return tuple(pools), cross_leaf, cross_spine

    def gang_pools(self, nodes: Sequence[int]) -> tuple[Pool, ...]:
        """The pools a ring over `nodes` crosses (FabricView's span rule)."""
        distinct = sorted(set(nodes))
        pools: list[Pool] = [(ACCESS, n) for n in distinct]
        if self._tables is not None and len(distinct) > 1:
            ring = zip(distinct, distinct[1:] + distinct[:1], strict=True)
            cables = dict.fromkeys(c for a, b in ring for c in self.route_cables(a, b))
            return tuple(pools) + tuple(cables)
        if self.view is not None and len(distinct) > 1:
            leaves = sorted({int(self.view.leaf_id[n]) for n in distinct})
            if len(leaves) > 1:
                pools += [(LEAF_UP, x) for x in leaves]
                spines = sorted({int(self.view.spine_id[n]) for n in distinct})
                if len(spines) > 1:
                    pools += [(SPINE_UP, s) for s in spines]
        return tuple(pools)

    def capacity_gbps(self, pool: Pool) -> float:
        cap = self._cap.get(pool)
        if cap is None:
            if self.view is None:
                cap = self.nic_gbps if pool[0] == ACCESS else math.inf
            elif pool[0] == CABLE:
                assert self._tables is not None
                cap = float(self._tables.arrays.links[pool[1]].available_gbps)
            else:
                cap = float(self.view.avail[pool[0]][pool[1]])
            cap *= max(self.rails, 1)
            self._cap[pool] = cap
        return cap

    def share_gbps(self, pools: Sequence[Pool], joining: bool = False) -> float:
        """The bottleneck equal share along `pools` (one more flow on each when `joining`)."""
        extra = 1 if joining else 0
        best = math.inf
        for pool in pools:
            best = min(best, self.capacity_gbps(pool) / max(self.count.get(pool, 0) + extra, 1))
        return best

    def estimate_s(self, a: int, b: int, nbytes: float) -> float:
        """What a transfer of `nbytes` from a to b would take at today's shares (what a router sees)."""
        pools, _, _ = self.path(a, b)
        gbps = self.share_gbps(pools, joining=True)
        return 0.0 if not pools or math.isinf(gbps) else nbytes * 8 / (gbps * 1e9)

    def others_delay_s(self, a: int, b: int, nbytes: float) -> float:
        """The time the flows already on the path's pools lose while a transfer of `nbytes` shares
        them: on a pool of capacity C with n flows, the newcomer takes C/(n+1) for nbytes/(C/(n+1))
        seconds and each of the n others loses nbytes/C seconds of its own progress (the network-aware
        policy's `others` term, for one KV flow)."""
        pools, _, _ = self.path(a, b)
        total = 0.0
        for pool in pools:
            cap = self.capacity_gbps(pool)
            flows = self.count.get(pool, 0)
            if flows and cap > 0 and math.isfinite(cap):
                total += flows * nbytes * 8 / (cap * 1e9)
        return total

    # ------------------------------------------------------------------ training

    def add_training(self, gangs: Sequence[Sequence[int]]) -> None:
        """Training gangs (node indices) beside the service: persistent flows from now on."""
        for nodes in gangs:
            pools = self.gang_pools(nodes)
            self._add(pools, who=-1 - len(self.trains))
            self.trains.append(_Train(tuple(sorted(set(nodes))), pools))
        rates = self._max_min({-1 - i: t.pools for i, t in enumerate(self.trains)})
        for i, train in enumerate(self.trains):
            train.alone_step_s = self._step_s(train, rates[-1 - i])
        self._rerate({p for t in self.trains for p in t.pools})

    def _step_s(self, train: _Train, gbps: float) -> float:
        p = len(train.nodes)
        spec = self.training
        if p < 2 or math.isinf(gbps):
            return spec.compute_s
        return spec.compute_s + 2 * (p - 1) / p * spec.gradient_gib * 2**30 * 8 / (gbps * 1e9)

    def training_slowdown(self, end_s: float) -> float:
        """Mean over training gangs of their time-averaged slowdown (1.0: none, or no training)."""
        self.advance(end_s)
        if not self.trains or end_s <= 0:
            return 1.0
        return sum(t.slow_integral / end_s for t in self.trains) / len(self.trains)

    # ------------------------------------------------------------------ flows

    def _add(self, pools: Sequence[Pool], sign: int = 1, who: int | None = None) -> None:
        for pool in pools:
            self.count[pool] = self.count.get(pool, 0) + sign
            if who is not None:
                members = self._on_pool.setdefault(pool, set())
                if sign > 0:
                    members.add(who)
                else:
                    members.discard(who)

    def start(self, now_s: float, fid: int, a: int, b: int, nbytes: float) -> None:
        """A transfer of `nbytes` from a to b begins now (re-rates every flow)."""
        self.advance(now_s)
        pools, cross_leaf, cross_spine = self.path(a, b)
        self.kv_bytes += nbytes
        if cross_leaf:
            self.cross_leaf_bytes += nbytes
        if cross_spine:
            self.cross_spine_bytes += nbytes
        self.flows[fid] = _Flow(pools, float(nbytes), 0.0, cross_leaf, cross_spine)
        self._add(pools, who=fid)
        self._rerate(set(pools))

    def next_finish(self) -> tuple[float, int] | None:
        """(time, flow id) of the flow that ends first at today's rates; None with no flow."""
        best: tuple[float, int] | None = None
        for fid, flow in self.flows.items():
            at = self.last_s + (flow.remaining / flow.rate_bps if flow.rate_bps > 0 else math.inf)
            if best is None or at < best[0]:
                best = (at, fid)
        return best

    def finish(self, now_s: float, fid: int) -> None:
        """The flow ended (its bytes arrived): take it off its pools, re-rate the rest."""
        self.advance(now_s)
        flow = self.flows.pop(fid)
        self._add(flow.pools, -1, who=fid)
        self._rerate(set(flow.pools))

    def rate_bps(self, fid: int) -> float:
        return self.flows[fid].rate_bps

    def _max_min(self, paths: dict[int, tuple[Pool, ...]]) -> dict[int, float]:
        """Max-min fair Gb/s of every entity in `paths` (flow ids >= 0, gangs < 0) by progressive
        filling; an entity with no finite pool on its path gets math.inf."""
        left: dict[Pool, float] = {}
        users: dict[Pool, list[int]] = {}
        for key, pools in paths.items():
            for pool in pools:
                cap = self.capacity_gbps(pool)
                if math.isfinite(cap):
                    left[pool] = cap
                    users.setdefault(pool, []).append(key)
        rate = {key: math.inf for key in paths}
        frozen: set[int] = set()
        active = {pool: len(keys) for pool, keys in users.items()}
        while active:
            pool = min(active, key=lambda q: (left[q] / active[q], q))
            level = max(left[pool], 0.0) / active[pool]
            for key in users[pool]:
                if key in frozen:
                    continue
                frozen.add(key)
                rate[key] = level
                for other in paths[key]:
                    if other in active:
                        left[other] -= level
                        active[other] -= 1
                        if active[other] == 0:
                            del active[other]
        return rate

    def _component(self, changed: set[Pool]) -> tuple[set[int], set[Pool]]:
        """The entities and pools connected to `changed` through shared pools: max-min rates
        outside it do not move when something inside it does."""
        who: set[int] = set()
        seen: set[Pool] = set()
        todo = list(changed)
        while todo:
            pool = todo.pop()
            if pool in seen:
                continue
            seen.add(pool)
            for key in self._on_pool.get(pool, ()):
                if key not in who:
                    who.add(key)
                    pools = self.flows[key].pools if key >= 0 else self.trains[-1 - key].pools
                    todo.extend(p for p in pools if p not in seen)
        return who, seen

    def _rerate(self, changed: set[Pool]) -> None:
        """Max-min fair rates for the flows and training gangs connected to the `changed` pools, and
        the utilisation of every pool they cross (held until the next change: `advance` integrates
        it)."""
        self.version += 1
        who, touched = self._component(changed)
        paths = {key: (self.flows[key].pools if key >= 0 else self.trains[-1 - key].pools) for key in who}
        rates = self._max_min(paths)
        for key in who:
            gbps = rates[key]
            if key >= 0:
                self.flows[key].rate_bps = (
                    (self.nic_gbps * max(self.rails, 1) if math.isinf(gbps) else gbps) * 1e9 / 8
                )
            else:
                train = self.trains[-1 - key]
                train.gbps_now = 0.0 if math.isinf(gbps) else gbps
                step = self._step_s(train, gbps)
                train.slow_now = step / train.alone_step_s if train.alone_step_s > 0 else 1.0
        for pool in touched:
            carried = 0.0
            for key in self._on_pool.get(pool, ()):
                carried += self.flows[key].rate_bps * 8 / 1e9 if key >= 0 else self.trains[-1 - key].gbps_now
            cap = self.capacity_gbps(pool)
            if carried > 0 and cap > 0 and math.isfinite(cap):
                self._util_now[pool] = carried / cap
            else:
                self._util_now.pop(pool, None)

    def advance(self, now_s: float) -> None:
        """Move every flow's bytes on to `now_s`; integrate link utilisation and training slowdown."""
        dt = now_s - self.last_s
        if dt <= 0:
            return
        for flow in self.flows.values():
            flow.remaining = max(0.0, flow.remaining - flow.rate_bps * dt)
        for train in self.trains:
            train.slow_integral += train.slow_now * dt
        integral, peak = self.util_integral, self.util_peak
        for pool, util in self._util_now.items():
            integral[pool] = integral.get(pool, 0.0) + util * dt
            if util > peak.get(pool, 0.0):
                peak[pool] = util
        self.last_s = now_s

    def link_report(self, end_s: float) -> dict[str, float]:
        """Time-averaged utilisation of the busiest uplink pool and of uplink pools on average, and
        the peak any uplink pool saw (HCA pools apart: one flow fills those alone)."""
        self.advance(end_s)
        up = {p: v / end_s for p, v in self.util_integral.items() if p[0] != ACCESS and end_s > 0}
        peaks = [v for p, v in self.util_peak.items() if p[0] != ACCESS]
        access = [v / end_s for p, v in self.util_integral.items() if p[0] == ACCESS and end_s > 0]
        return {
            "uplink_util_mean": sum(up.values()) / len(up) if up else 0.0,
            "uplink_util_max": max(up.values(), default=0.0),
            "uplink_util_peak": max(peaks, default=0.0),
            "hca_util_mean": sum(access) / len(access) if access else 0.0,
        }
