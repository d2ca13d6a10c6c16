"""Where a workload of a federation of pools should run: members ranked by a named placement policy.

Pure and deterministic: the caller hands in the members (static: region, price book, WAN links, data
sets), their states now (up, free devices, queued work) and the time; `rank` returns the members that
can take the request, best first, each with its expected start, cost and the reason it ranks there,
and the members that cannot, each with the reason. The hub offers the request down that list
(MultiKueue-style: the first member to admit it keeps it); the replay does the same.

Money is in the price book's currency; times are seconds of the caller's clock, read as UTC
(`Member.utc_offset_h` turns it into the member's local hour for its time-of-day prices).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

DAY_S = 86400.0
HOUR_S = 3600.0
SAME_REGION_GBIT = 100.0
"""WAN bandwidth between two members of one region when their links do not name it."""
SAME_REGION_LATENCY_MS = 1.0


class Policy(StrEnum):
    HOME = "home"
    CHEAPEST = "cheapest"
    FASTEST = "fastest"
    BALANCED = "balanced"
    DATA_LOCAL = "data-local"


class LatencyClass(StrEnum):
    BATCH = "batch"
    INTERACTIVE = "interactive"
    SERVICE = "service"


def parse_policy(name: str) -> Policy:
    """The policy named `name`; a ValueError with the names (and the closest one) otherwise."""
    try:
        return Policy(name.strip().lower())
    except ValueError:
        names = [p.value for p in Policy]
        close = difflib.get_close_matches(name.strip().lower(), names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"Unknown placement policy {name!r}; choose one of {', '.join(names)}.{hint}") from None


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """Local hours [start_h, end_h) of every day (wrapping past midnight when end < start) at which
    prices are multiplied by `multiplier` (a night discount: 22 -> 6 at 0.5)."""

    start_h: float
    end_h: float
    multiplier: float

    def covers(self, hour: float) -> bool:
        if self.start_h <= self.end_h:
            return self.start_h <= hour < self.end_h
        return hour >= self.start_h or hour < self.end_h


@dataclass(frozen=True, slots=True)
class PriceBook:
    """Price per device-hour by device kind, with time-of-day multipliers (the first window that
    covers an hour applies; none: 1.0)."""

    per_device_hour: Mapping[str, float]
    windows: tuple[TimeWindow, ...] = ()
    utc_offset_h: float = 0.0

    def multiplier(self, t_s: float) -> float:
        hour = ((t_s / HOUR_S) + self.utc_offset_h) % 24.0
        for window in self.windows:
            if window.covers(hour):
                return window.multiplier
        return 1.0

    def _breaks(self) -> list[float]:
        """Local hours at which the multiplier may change, sorted, in [0, 24)."""
        edges = {w.start_h % 24.0 for w in self.windows} | {w.end_h % 24.0 for w in self.windows}
        return sorted(edges | {0.0})

    def cost(self, kind: str, devices: float, start_s: float, end_s: float) -> float:
        """What `devices` devices of `kind` cost from start_s to end_s, each hour at its price
        (KeyError: the book has no price for the kind; the caller checks with `prices`)."""
        if end_s <= start_s or devices <= 0:
            return 0.0
        rate = self.per_device_hour[kind] * devices / HOUR_S
        if not self.windows:
            return rate * (end_s - start_s)
        breaks = self._breaks()
        total, t = 0.0, start_s
        while t < end_s:
            local_h = ((t / HOUR_S) + self.utc_offset_h) % 24.0
            nxt = next((b for b in breaks if b > local_h + 1e-9), 24.0)
            seg_end = min(end_s, t + (nxt - local_h) * HOUR_S)
            if seg_end <= t:  # float dust at a boundary
                seg_end = min(end_s, t + 1e-6)
            total += rate * self.multiplier(t) * (seg_end - t)
            t = seg_end
        return total

    def prices(self, kind: str) -> bool:
        return kind in self.per_device_hour


@dataclass(frozen=True, slots=True)
class Link:
    """The WAN from one member's region to another region."""

    gbit_s: float
    latency_ms: float = 0.0


@dataclass(frozen=True)
class Member:
    """A pool of the federation as the hub knows it from its configuration."""

    name: str
    region: str
    prices: PriceBook
    egress_per_gb: float = 0.0
    """What sending one GB out of this member costs (paid by whoever pulls a data set from it)."""
    links: Mapping[str, Link] = field(default_factory=dict)
    """Region -> the WAN link to it (bandwidth, latency)."""
    datasets: frozenset[str] = frozenset()

    def link_to(self, region: str) -> Link | None:
        link = self.links.get(region)
        if link is None and region == self.region:
            return Link(SAME_REGION_GBIT, SAME_REGION_LATENCY_MS)
        return link


@dataclass(frozen=True)
class MemberState:
    """What a member reports now: whether it answers, its free and total devices by kind, the work
    queued in it and the work still to run on its busy devices (device-seconds)."""

    up: bool
    free: Mapping[str, float]
    capacity: Mapping[str, float]
    queued_device_s: float = 0.0
    running_device_s: float = 0.0
    expected_start_s: float | None = None
    """A start estimate the member reports itself (its backfill estimator); None: `estimate_start_s`."""


def estimate_start_s(state: MemberState, kind: str, devices: float) -> float:
    """Seconds until `devices` of `kind` would start on the member: 0 when they are free and nothing
    queues; else the fluid bound: the queued work drained at full capacity, plus, when the free
    devices are too few, the busy devices' remaining work drained too."""
    if state.expected_start_s is not None:
        return state.expected_start_s
    capacity = state.capacity.get(kind, 0.0)
    if capacity <= 0:
        return math.inf
    free = state.free.get(kind, 0.0)
    if state.queued_device_s <= 0 and free >= devices:
        return 0.0
    wait = state.queued_device_s / capacity
    if free < devices:
        wait += state.running_device_s / capacity
    return wait


@dataclass(frozen=True, slots=True)
class FedRequest:
    """A workload as the hub sees it when placing it."""

    tenant: str
    home: str
    """The tenant's home member."""
    devices: float
    kind: str = "gpu"
    runtime_s: float = 3600.0
    """Expected run time at full speed."""
    latency: LatencyClass = LatencyClass.BATCH
    dataset: str | None = None
    dataset_gb: float = 0.0
    wait_price_per_h: float = 0.0
    """What an hour of waiting (queueing, data transfer, slowdown) is worth to the tenant (`balanced`)."""
    allow_remote: bool = False
    """Interactive and service work may leave its home region (batch work always may)."""
    multi_cluster: bool = False
    """A gang may be split over several members (hierarchical all-reduce over the WAN)."""
    max_slowdown: float = 1.25
    """The slowdown above which a multi-cluster split is refused."""
    sync_gb_per_step: float = 1.0
    """Gradient bytes a training step all-reduces, and the step's compute time, for the split model."""
    step_s: float = 1.0


@dataclass(frozen=True, slots=True)
class Choice:
    """A placement the hub may offer: on `member` (or split over `split`'s members)."""

    member: str
    expected_start_s: float
    """Seconds from now until it runs: the member's queue, or the data transfer if longer."""
    cost: float
    """Compute (at the time-of-day prices over the run) plus the data set's egress."""
    compute_cost: float
    egress_cost: float
    transfer_s: float
    transfer_gb: float
    runtime_s: float
    """Its run time there (longer than asked when split, by the slowdown)."""
    score: float
    reason: str
    split: tuple[tuple[str, float], ...] = ()

    @property
    def completion_s(self) -> float:
        return self.expected_start_s + self.runtime_s


@dataclass(frozen=True, slots=True)
class Refusal:
    member: str
    reason: str


@dataclass(frozen=True, slots=True)
class Ranking:
    choices: tuple[Choice, ...]
    refused: tuple[Refusal, ...]


def transfer(request: FedRequest, target: Member, members: Mapping[str, Member],
             states: Mapping[str, MemberState]) -> tuple[float, float, float, str] | None:
    """(seconds, GB, egress cost, source) to bring the request's data set to `target`: nothing when it
    holds it; else from the up member holding it that delivers it soonest (its egress price); else from
    the home member. None: no link reaches `target`."""
    if request.dataset is None or request.dataset_gb <= 0 or request.dataset in target.datasets:
        return 0.0, 0.0, 0.0, target.name
    holders = [m for m in members.values() if request.dataset in m.datasets and states[m.name].up]
    if not holders and target.name == request.home:
        return 0.0, 0.0, 0.0, target.name  # a data set no member lists is the tenant's, at home
    fallback = [members[request.home]] if request.home in members else []
    sources = sorted(holders, key=lambda m: m.name) or fallback
    best: tuple[float, float, float, str] | None = None
    for source in sources:
        link = source.link_to(target.region)
        if link is None or link.gbit_s <= 0:
            continue
        seconds = request.dataset_gb * 8.0 / link.gbit_s + link.latency_ms / 1000.0
        candidate = (seconds, request.dataset_gb, request.dataset_gb * source.egress_per_gb, source.name)
        if best is None or (candidate[0], candidate[2]) < (best[0], best[2]):
            best = candidate
    return best


def split_slowdown(request: FedRequest, members: Sequence[Member]) -> float:
    """Step-time ratio of a gang split over `members`: each member reduces inside itself (as it would
    unsplit), the members' leaders ring all-reduce over the slowest WAN link between them
    (2(k-1)/k of the gradient bytes, 2(k-1) latencies), then broadcast inside."""
    k = len(members)
    if k <= 1:
        return 1.0
    worst_gbit, worst_latency_ms = math.inf, 0.0
    for a in members:
        for b in members:
            if a.name == b.name:
                continue
            link = a.link_to(b.region)
            if link is None or link.gbit_s <= 0:
                return math.inf
            worst_gbit = min(worst_gbit, link.gbit_s)
            worst_latency_ms = max(worst_latency_ms, link.latency_ms)
    wan_s = (2 * (k - 1) / k * request.sync_gb_per_step * 8.0 / worst_gbit
             + 2 * (k - 1) * worst_latency_ms / 1000)
    return (request.step_s + wan_s) / request.step_s


def rank(request: FedRequest, members: Sequence[Member], states: Mapping[str, MemberState],
         policy: Policy | str, now_s: float) -> Ranking:
    """The members that can take `request` under `policy`, best first, and those that cannot (why)."""
    policy = parse_policy(policy) if not isinstance(policy, Policy) else policy
    by_name = {m.name: m for m in members}
    home = by_name.get(request.home)
    refused: list[Refusal] = []
    choices: list[Choice] = []
    for member in sorted(members, key=lambda m: m.name):
        why = _excluded(request, member, home, states.get(member.name), policy)
        if why is not None:
            refused.append(Refusal(member.name, why))
            continue
        choice = _choice(request, member, by_name, states, now_s)
        if isinstance(choice, str):
            refused.append(Refusal(member.name, choice))
        else:
            choices.append(choice)
    if request.multi_cluster:
        split = _split_choice(request, members, home, states, policy, now_s)
        if isinstance(split, Refusal):
            refused.append(split)
        elif split is not None:
            choices.append(split)
    scored = (_scored(c, request, policy) for c in choices)
    ordered = sorted(scored, key=lambda c: (c.score, c.completion_s, c.member))
    return Ranking(tuple(ordered), tuple(refused))


def _excluded(request: FedRequest, member: Member, home: Member | None, state: MemberState | None,
              policy: Policy) -> str | None:
    if state is None or not state.up:
        return f"member {member.name} is down"
    if policy is Policy.HOME and member.name != request.home:
        return f"policy home keeps the work in its home member {request.home}"
    if (request.latency is not LatencyClass.BATCH and not request.allow_remote and home is not None
            and member.region != home.region):
        return (f"{request.latency.value} work stays in its home region {home.region} unless the "
                "tenant allows remote placement")
    if not member.prices.prices(request.kind):
        return f"member {member.name} has no price for device kind {request.kind!r} (it has none of them)"
    if state.capacity.get(request.kind, 0.0) < request.devices:
        return (f"member {member.name} has {state.capacity.get(request.kind, 0.0):g} {request.kind} devices "
                f"in all, fewer than the {request.devices:g} asked")
    if policy is Policy.DATA_LOCAL and request.dataset is not None and request.dataset not in member.datasets:
        return f"policy data-local runs work only where its data set {request.dataset!r} is held"
    return None


def _choice(request: FedRequest, member: Member, by_name: Mapping[str, Member],
            states: Mapping[str, MemberState], now_s: float) -> Choice | str:
    moved = transfer(request, member, by_name, states)
    if moved is None:
        return f"no WAN link brings data set {request.dataset!r} to {member.name}"
    transfer_s, gb, egress, source = moved
    queue_s = estimate_start_s(states[member.name], request.kind, request.devices)
    start_s = max(queue_s, transfer_s)  # the data set is staged while the work queues
    compute = member.prices.cost(request.kind, request.devices, now_s + start_s,
                                 now_s + start_s + request.runtime_s)
    where = "home" if member.name == request.home else "remote"
    reason = f"{where}; starts in ~{start_s:.0f} s"
    if gb:
        reason += f"; {gb:g} GB of {request.dataset} from {source} in {transfer_s:.0f} s"
    return Choice(member.name, start_s, compute + egress, compute, egress, transfer_s, gb, request.runtime_s,
                  0.0, reason)


def _split_choice(request: FedRequest, members: Sequence[Member], home: Member | None,
                  states: Mapping[str, MemberState], policy: Policy, now_s: float) -> Choice | Refusal | None:
    """The gang over the fewest members whose free devices cover it now (most free first), when one
    member cannot start it now; refused above the slowdown bound."""
    usable = [m for m in sorted(members, key=lambda m: m.name)
              if _excluded(request, m, home, states.get(m.name), policy) is None
              or _fits_only_split(request, m, home, states.get(m.name), policy)]
    if any(states[m.name].free.get(request.kind, 0.0) >= request.devices for m in usable):
        return None  # one member starts it now: no reason to split
    usable.sort(key=lambda m: (-states[m.name].free.get(request.kind, 0.0), m.name))
    parts: list[tuple[Member, float]] = []
    need = request.devices
    for m in usable:
        free = states[m.name].free.get(request.kind, 0.0)
        if free <= 0 or need <= 0:
            continue
        take = min(free, need)
        parts.append((m, take))
        need -= take
    if need > 1e-9 or len(parts) < 2:
        return None
    names = "+".join(m.name for m, _ in parts)
    slowdown = split_slowdown(request, [m for m, _ in parts])
    if slowdown > request.max_slowdown:
        return Refusal(names, f"split over {names} would slow the gang {slowdown:.2f}x, above the "
                              f"bound {request.max_slowdown:.2f}x")
    runtime = request.runtime_s * slowdown
    compute = egress = transfer_s = gb = 0.0
    for m, _ in parts:
        moved = transfer(request, m, {x.name: x for x in members}, states)
        if moved is None:
            return Refusal(names, f"no WAN link brings data set {request.dataset!r} to {m.name}")
        transfer_s, gb, egress = max(transfer_s, moved[0]), gb + moved[1], egress + moved[2]
    for m, take in parts:
        compute += m.prices.cost(request.kind, take, now_s + transfer_s, now_s + transfer_s + runtime)
    return Choice(parts[0][0].name, transfer_s, compute + egress, compute, egress, transfer_s, gb, runtime,
                  0.0, f"split over {names} ({slowdown:.2f}x slower)", tuple((m.name, t) for m, t in parts))


def _fits_only_split(request: FedRequest, member: Member, home: Member | None, state: MemberState | None,
                     policy: Policy) -> bool:
    """A member too small for the whole gang may still take part of a split one."""
    if state is None or not state.up:
        return False
    return _excluded(replace(request, devices=0.0), member, home, state, policy) is None


def _scored(choice: Choice, request: FedRequest, policy: Policy) -> Choice:
    delay_h = (choice.completion_s - request.runtime_s) / HOUR_S  # waiting, transfer and slowdown
    if policy is Policy.CHEAPEST:
        score = choice.cost
    elif policy is Policy.FASTEST:
        score = choice.completion_s
    elif policy is Policy.HOME:
        score = 0.0
    else:  # balanced, and data-local among the members that hold the data
        score = choice.cost + request.wait_price_per_h * delay_h
    return replace(choice, score=score)


def reoffer(request: FedRequest, current: str, members: Sequence[Member], states: Mapping[str, MemberState],
            policy: Policy | str, now_s: float) -> tuple[Choice, str] | None:
    """Where work still queued at member `current` should move, and why; None: it stays.

    MultiKueue keeps queued work offered to every candidate; here the hub re-ranks it instead. It moves
    when another member can start it now (its free devices cover it and nothing queues there), sooner
    than `current` expects to, and that member ranks better by the policy's own measure (its score).
    `states[current]` must count only the work ahead of it, not the work itself. Under `home` nothing
    moves (there is one candidate)."""
    ranking = rank(request, members, states, policy, now_s)
    here = next((c for c in ranking.choices if c.member == current and not c.split), None)
    for choice in ranking.choices:  # best first
        if choice.member == current or choice.split:
            continue
        if estimate_start_s(states[choice.member], request.kind, request.devices) > 0:
            continue  # it could not start there now (too few free devices, or a queue of its own)
        if here is None:
            return choice, f"{current} may no longer take it; {choice.member} starts it now"
        if choice.score < here.score and choice.expected_start_s < here.expected_start_s:
            return choice, (f"{choice.member} starts it in ~{choice.expected_start_s:.0f} s, {current} in "
                            f"~{here.expected_start_s:.0f} s, and ranks better under "
                            f"{parse_policy(policy).value if isinstance(policy, str) else policy.value} "
                            f"({choice.score:.4g} against {here.score:.4g})")
        return None  # the best member that could start it now does not beat where it is
    return None
