"""The federated replay's file: the hub's fed.yaml (read by the one reader, gpupool/fedfile.py: members,
regions and their WAN links, price books, named data sets, tenants' homes) with a `simulation`
section for what only the replay needs: each member's simulated nodes, the default home of the
trace's tenants, the drawn data sets, the price on waiting, a failure, the re-offer's period.

An older form (members with `cluster` and `price_per_gpu_hour`, `links`, `homes` at the top) is still
read, into the same FedSpec. Read strictly (unknown fields refused, each error names its field); see
docs/experiments/federation.md for the file the benchmark uses and what each field means.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from gpupool.core.federation import Link, Member, PriceBook, TimeWindow
from gpupool.errors import InvalidInput
from gpupool.fedfile import FederationConfig, load_federation


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Night(_Strict):
    start_h: float = Field(22.0, ge=0, lt=24)
    end_h: float = Field(6.0, ge=0, lt=24)
    multiplier: float = Field(0.7, gt=0)


class MemberSpec(_Strict):
    name: str = Field(min_length=1)
    region: str = Field(min_length=1)
    cluster: str = Field(min_length=1)
    """Its nodes, as `gpupool sim replay --cluster` takes them (32x8xV100M32)."""
    price_per_gpu_hour: float = Field(gt=0)
    night: Night | None = None
    utc_offset_h: float = Field(0.0, ge=-12, le=14)
    egress_per_gb: float = Field(0.0, ge=0)


class LinkSpec(_Strict):
    a: str
    b: str
    gbit_s: float = Field(gt=0)
    latency_ms: float = Field(0.0, ge=0)


class DatasetSpec(_Strict):
    """Each tenant (virtual cluster) owns `per_tenant` data sets held at its home; sizes are
    lognormal (median `median_gb`, shape `sigma`), capped at `max_gb`; a share of them is also held
    at `replicated_to`. Each job reads one of its tenant's sets (drawn uniformly, seeded)."""

    per_tenant: int = Field(4, ge=1, le=1000)
    median_gb: float = Field(50.0, gt=0)
    sigma: float = Field(1.5, ge=0)
    max_gb: float = Field(2000.0, gt=0)
    replicated_to: str | None = None
    replicated_share: float = Field(0.0, ge=0, le=1)
    cache: bool = True
    """A set moved to a member stays there for later jobs (a cache that never evicts)."""


class FailureSpec(_Strict):
    member: str
    at_h: float = Field(ge=0)
    """Hours after the first arrival of the replay."""
    for_h: float = Field(24.0, gt=0)
    grace_s: float = Field(600.0, ge=0)
    """How long the hub waits before requeueing a down member's running work elsewhere."""


class FedSpec(_Strict):
    members: list[MemberSpec] = Field(min_length=1)
    links: list[LinkSpec] = Field(default_factory=list)
    homes: dict[str, str] = Field(default_factory=dict)
    """Philly virtual cluster -> its home member."""
    default_home: str
    datasets: DatasetSpec = Field(default_factory=lambda: DatasetSpec.model_validate({}))
    wait_price_per_device_hour: float = Field(1.0, ge=0)
    """What an hour of delay of one device's work is worth to its tenant (`balanced`)."""
    failure: FailureSpec | None = None
    """The member that fails (in the failure variant)."""
    reoffer_every_s: float = Field(300.0, ge=0)
    """How often the hub re-ranks queued work (0: never; queued work then stays at its first choice)."""
    reoffer_after_s: float = Field(600.0, ge=0)
    """Only work queued at its member at least this long is re-ranked."""
    _core: tuple[Member, ...] | None = PrivateAttr(default=None)
    """The members as the hub's file states them (its price books and links), when read from one."""

    @model_validator(mode="after")
    def _names(self) -> FedSpec:
        names = [m.name for m in self.members]
        if len(set(names)) != len(names):
            raise ValueError("members: two members share a name; give each its own")
        regions = {m.region for m in self.members}
        for i, link in enumerate(self.links):
            for end in (link.a, link.b):
                if end not in regions:
                    raise ValueError(f"links.{i}: region {end!r} has no member (regions: {sorted(regions)})")
        for vc, home in {**self.homes, "default_home": self.default_home}.items():
            if home not in names:
                field = "default_home" if vc == "default_home" else f"homes.{vc}"
                raise ValueError(f"{field}: {home!r} is not a member (members: {', '.join(names)})")
        if self.failure is not None and self.failure.member not in names:
            raise ValueError(f"failure.member: {self.failure.member!r} is not a member")
        if self.datasets.replicated_to is not None and self.datasets.replicated_to not in names:
            raise ValueError(f"datasets.replicated_to: {self.datasets.replicated_to!r} is not a member")
        return self

    def core_members(self) -> tuple[Member, ...]:
        """The members as core/federation.py ranks them (data sets are added by the replay)."""
        if self._core is not None:
            return self._core
        out = []
        for m in self.members:
            windows = (TimeWindow(m.night.start_h, m.night.end_h, m.night.multiplier),) if m.night else ()
            links: dict[str, Link] = {}
            for link in self.links:
                if m.region in (link.a, link.b):
                    other = link.b if m.region == link.a else link.a
                    links[other] = Link(link.gbit_s, link.latency_ms)
            book = PriceBook({"gpu": m.price_per_gpu_hour}, windows, m.utc_offset_h)
            out.append(Member(m.name, m.region, book, m.egress_per_gb, links))
        return tuple(out)


class SimulationSpec(_Strict):
    """fed.yaml's `simulation` section (the hub ignores it)."""

    clusters: dict[str, str]
    """Member -> its simulated nodes, as `gpupool sim replay --cluster` takes them (32x8xV100M32)."""
    default_home: str | None = None
    """The home of the trace's tenants that `tenants` does not name (default: the first member)."""
    datasets: DatasetSpec = Field(default_factory=lambda: DatasetSpec.model_validate({}))
    wait_price_per_device_hour: float = Field(1.0, ge=0)
    failure: FailureSpec | None = None
    reoffer_every_s: float = Field(300.0, ge=0)
    reoffer_after_s: float = Field(600.0, ge=0)


def spec_of(config: FederationConfig) -> FedSpec:
    """The replay's FedSpec from the hub's file as the one reader returned it; ValueError naming the
    field of the simulation section that is wrong."""
    sim = SimulationSpec.model_validate(config.simulation)
    names = [m.name for m in config.members]
    missing = [n for n in names if n not in sim.clusters]
    if missing or set(sim.clusters) - set(names):
        extra = sorted(set(sim.clusters) - set(names))
        raise ValueError("simulation.clusters must give every member its nodes and name no other: "
                         + (f"missing {', '.join(missing)}" if missing else f"no member {', '.join(extra)}"))
    members = [MemberSpec(name=m.name, region=m.region, cluster=sim.clusters[m.name],
                          price_per_gpu_hour=m.prices.per_device_hour.get("gpu", 0.0) or 1.0,
                          utc_offset_h=0.0, egress_per_gb=m.egress_per_gb) for m in config.members]
    spec = FedSpec(members=members, homes={t: p.home for t, p in config.tenants.items() if p.home},
                   default_home=sim.default_home or names[0], datasets=sim.datasets,
                   wait_price_per_device_hour=sim.wait_price_per_device_hour, failure=sim.failure,
                   reoffer_every_s=sim.reoffer_every_s, reoffer_after_s=sim.reoffer_after_s)
    spec._core = tuple(config.core_members())
    return spec


def load_fed_spec(path: str | Path) -> FedSpec:
    """The file at `path`; InvalidInput naming the file and the bad field otherwise."""
    import yaml

    from gpupool.yamlfiles import read_text, safe_load

    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"Federation file {path} does not exist; give the path of a fed.yaml.")
    try:
        data = safe_load(read_text(path, "the federation file")) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc
        raise InvalidInput(f"{path}{where} is not valid YAML ({problem}).") from None
    hub_form = isinstance(data, dict) and "simulation" in data
    try:
        if hub_form:
            return spec_of(load_federation(path, replay=True))
        return FedSpec.model_validate(data)
    except ValueError as exc:
        if not isinstance(exc, ValidationError):
            raise InvalidInput(f"{path}: {exc}; see docs/experiments/federation.md for the fields.") from None
        err = exc.errors()[0]
        loc = ("simulation",) if hub_form else ()
        field = ".".join(str(p) for p in (*loc, *err["loc"])) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        raise InvalidInput(f"{path}: field {field}: {msg}; see docs/experiments/federation.md for the "
                           "fields.") from None
