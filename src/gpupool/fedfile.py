"""fed.yaml, the one reader: the member pools a federation hub places work on (docs/federation.md),
and the same file for the federated replay (`gpupool sim federate`), whose own parts (each member's
simulated nodes, how the trace maps onto members) sit in its `simulation` section, which the hub
ignores and the replay checks (sim/federation_config.py).

Every problem found is reported, one sentence each, in one InvalidInput (`gpupool up` exits 2).
With `replay=True` a member's `url` and `token_file` may be left out (nothing is called).
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpupool.core.federation import Link, Member, Policy, PriceBook, TimeWindow
from gpupool.errors import InvalidInput, did_you_mean
from gpupool.yamlfiles import read_text, safe_load

POLICIES = tuple(p.value for p in Policy)
"""The placement policies a hub knows (their maths: core/federation.py)."""

_TOP = ("policy", "member_down_after_s", "requeue_grace_s", "poll_interval_s", "offer_timeout_s",
        "checkpoint_max_mb", "members",
        "regions",
        "datasets", "tenants", "simulation")
_MEMBER = ("name", "url", "token_file", "region", "prices", "egress_per_gb", "datasets")
_PRICES = ("currency", "gpu_hour", "windows")
_WINDOW = ("hours", "multiplier")
_LINK = ("bandwidth_gbps", "latency_ms")
_TENANT = ("home", "policy", "max_gpus", "may_leave_home", "wait_price_per_h")


@dataclass(frozen=True, slots=True)
class MemberConfig:
    name: str
    url: str
    token: str = field(repr=False)
    region: str
    prices: PriceBook
    currency: str = "USD"
    egress_per_gb: float = 0.0
    datasets: tuple[str, ...] = ()

    def price_now(self, now_s: float) -> float:
        """One GPU-hour at `now_s` (the time-of-day window that covers it)."""
        return self.prices.per_device_hour.get("gpu", 0.0) * self.prices.multiplier(now_s)


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    home: str | None = None
    policy: str | None = None
    max_gpus: float | None = None
    """Federation-wide: the GPUs its unfinished work may ask for across all members together."""
    may_leave_home: bool = False
    """Interactive and service work may be placed outside its home region."""
    wait_price_per_h: float = 0.0
    """What an hour of waiting is worth to the tenant (the `balanced` policy)."""


@dataclass(frozen=True, slots=True)
class FederationConfig:
    members: tuple[MemberConfig, ...]
    policy: str = "home"
    member_down_after_s: float = 10.0
    requeue_grace_s: float = 30.0
    poll_interval_s: float = 1.0
    offer_timeout_s: float = 10.0
    """A copy still waiting on its member this long is withdrawn when another member has room now."""
    checkpoint_max_mb: float = 64.0
    """The largest checkpoint the hub fetches and carries to the member that runs the work next."""
    links: dict[tuple[str, str], Link] = field(default_factory=dict)
    """(from region, to region) -> the WAN link"""
    datasets: dict[str, float] = field(default_factory=dict)
    """name -> size in GB"""
    tenants: dict[str, TenantPolicy] = field(default_factory=dict)
    simulation: dict[str, Any] = field(default_factory=dict)
    """The replay's own section, unread by the hub (sim/federation_config.py checks it)."""

    def member(self, name: str) -> MemberConfig:
        return next(m for m in self.members if m.name == name)

    def home_of(self, tenant: str) -> str:
        choice = self.tenants.get(tenant, TenantPolicy()).home
        return choice or self.members[0].name

    def policy_of(self, tenant: str) -> str:
        return self.tenants.get(tenant, TenantPolicy()).policy or self.policy

    def core_members(self) -> list[Member]:
        """The members as core/federation.py ranks them."""
        return [Member(name=m.name, region=m.region, prices=m.prices, egress_per_gb=m.egress_per_gb,
                       links={dst: link for (src, dst), link in self.links.items() if src == m.region},
                       datasets=frozenset(m.datasets)) for m in self.members]


class _Problems:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.items: list[str] = []

    def add(self, sentence: str) -> None:
        self.items.append(sentence)

    def keys(self, where: str, value: Any, known: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.add(f"{where} must be a mapping of {', '.join(known)}.")
            return {}
        for key in value:
            if key not in known:
                self.add(f"{where} has an unknown key {key!r}; it takes {', '.join(known)}."
                         f"{did_you_mean(str(key), list(known))}")
        return value

    def number(self, where: str, value: Any, *, low: float = 0.0, positive: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or value < low or (positive and value <= 0):
            self.add(f"{where} must be a {'positive' if positive else 'non-negative'} number, not {value!r}.")
            return 0.0
        return float(value)

    def policy(self, where: str, value: Any) -> str:
        if value not in POLICIES:
            self.add(f"{where}: there is no policy {value!r}; use one of {', '.join(POLICIES)}."
                     f"{did_you_mean(str(value), list(POLICIES))}")
            return "home"
        return str(value)


def load_federation(path: Path, *, replay: bool = False) -> FederationConfig:
    """The federation from `path`; InvalidInput naming every problem, one sentence each. `replay`:
    for the federated replay (members need no url or token_file)."""
    try:
        raw = safe_load(read_text(path, "the federation file"))
    except OSError as exc:
        raise InvalidInput(f"Cannot read the federation file {str(path)!r}: {exc.strerror}.") from None
    except Exception as exc:  # yaml.YAMLError: the parser's own sentence, with the line
        raise InvalidInput(f"The federation file {str(path)!r} is not valid YAML: "
                           f"{' '.join(str(exc).split())}.") from None
    problems = _Problems(path)
    top = problems.keys("fed.yaml", raw, _TOP)
    members = _members(problems, top.get("members"), path.parent, replay)
    names = [m.name for m in members]
    regions = {m.region for m in members}
    links = _links(problems, top.get("regions", {}) or {}, regions)
    datasets: dict[str, float] = {}
    for name, spec in _mapping(problems, "datasets", top.get("datasets")).items():
        sized = problems.keys(f"datasets.{name}", spec, ("size_gb",))
        datasets[str(name)] = problems.number(f"datasets.{name}.size_gb", sized.get("size_gb"), positive=True)
    for member in members:
        for held in member.datasets:
            if held not in datasets:
                problems.add(f"members.{member.name}.datasets names {held!r}, which datasets does not "
                             f"define; add it there with its size_gb.{did_you_mean(held, list(datasets))}")
    tenants: dict[str, TenantPolicy] = {}
    for tenant, spec in _mapping(problems, "tenants", top.get("tenants")).items():
        entry = problems.keys(f"tenants.{tenant}", spec, _TENANT)
        home = entry.get("home")
        if home is not None and home not in names:
            problems.add(f"tenants.{tenant}.home is {home!r}, which is no member; use one of "
                         f"{', '.join(names)}.{did_you_mean(str(home), names)}")
        policy = problems.policy(f"tenants.{tenant}.policy", entry["policy"]) if "policy" in entry else None
        max_gpus = (problems.number(f"tenants.{tenant}.max_gpus", entry["max_gpus"])
                    if "max_gpus" in entry else None)
        tenants[str(tenant)] = TenantPolicy(
            home=home, policy=policy, max_gpus=max_gpus,
            may_leave_home=bool(entry.get("may_leave_home", False)),
            wait_price_per_h=problems.number(f"tenants.{tenant}.wait_price_per_h",
                                             entry.get("wait_price_per_h", 0.0)))
    config = FederationConfig(
        members=tuple(members),
        policy=problems.policy("policy", top.get("policy", "home")),
        member_down_after_s=problems.number("member_down_after_s", top.get("member_down_after_s", 10.0),
                                            positive=True),
        requeue_grace_s=problems.number("requeue_grace_s", top.get("requeue_grace_s", 30.0)),
        poll_interval_s=problems.number("poll_interval_s", top.get("poll_interval_s", 1.0), positive=True),
        offer_timeout_s=problems.number("offer_timeout_s", top.get("offer_timeout_s", 10.0), positive=True),
        checkpoint_max_mb=min(256.0, problems.number("checkpoint_max_mb", top.get("checkpoint_max_mb", 64.0),
                                                     positive=True)),
        links=links, datasets=datasets, tenants=tenants,
        simulation=_mapping(problems, "simulation", top.get("simulation")))
    if problems.items:
        raise InvalidInput(" ".join(f"{path}: {item}" for item in problems.items), problems=problems.items)
    return config


def _mapping(problems: _Problems, where: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.add(f"{where} must be a mapping of names to their settings.")
        return {}
    return value


def _members(problems: _Problems, raw: Any, base: Path, replay: bool = False) -> list[MemberConfig]:
    if not isinstance(raw, list) or not raw:
        problems.add("members must be a list of at least one member pool (name, url, token_file, region).")
        return []
    out: list[MemberConfig] = []
    for index, spec in enumerate(raw):
        entry = problems.keys(f"members[{index}]", spec, _MEMBER)
        if not entry:
            continue
        name = str(entry.get("name", ""))
        where = f"members.{name or index}"
        if not name or not name.replace("-", "").replace("_", "").isalnum():
            problems.add(f"members[{index}].name must be a word of letters, digits, '-' or '_', "
                         f"not {name!r}.")
        if name in {m.name for m in out}:
            problems.add(f"{where} is named twice; give each member its own name.")
        url = str(entry.get("url", ""))
        parts = urlsplit(url)
        if (parts.scheme not in ("http", "https") or not parts.hostname) and not (replay and not url):
            problems.add(f"{where}.url must be http(s)://HOST:PORT of the member's API, not {url!r}.")
        token = "" if replay else _token(problems, where, entry.get("token_file"), base)
        region = entry.get("region")
        if not isinstance(region, str) or not region:
            problems.add(f"{where}.region must name the member's region (a word).")
            region = ""
        prices, currency = _prices(problems, where, entry.get("prices", {}))
        out.append(MemberConfig(name=name, url=url.rstrip("/"), token=token, region=region,
                                prices=prices, currency=currency,
                                egress_per_gb=problems.number(f"{where}.egress_per_gb",
                                                              entry.get("egress_per_gb", 0.0)),
                                datasets=tuple(str(d) for d in entry.get("datasets", []) or [])))
    return out


def _token(problems: _Problems, where: str, value: Any, base: Path) -> str:
    if not isinstance(value, str) or not value:
        problems.add(f"{where}.token_file must name a file holding the member's federation token "
                     "(gpupool token create --admin --scope federation, on the member).")
        return ""
    path = base / value
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        problems.add(f"{where}.token_file {str(path)!r} cannot be read ({exc.strerror}).")
        return ""
    if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
        problems.add(f"{where}.token_file {str(path)!r} is readable by others; chmod 600 it.")
    if not text:
        problems.add(f"{where}.token_file {str(path)!r} is empty; put the member's federation token in it.")
    return text


def _prices(problems: _Problems, where: str, raw: Any) -> tuple[PriceBook, str]:
    entry = problems.keys(f"{where}.prices", raw or {}, _PRICES)
    windows: list[TimeWindow] = []
    for index, spec in enumerate(entry.get("windows", []) or []):
        window = problems.keys(f"{where}.prices.windows[{index}]", spec, _WINDOW)
        hours = str(window.get("hours", ""))
        start, _, end = hours.partition("-")
        if not (start.isdigit() and end.isdigit() and int(start) < 24 and int(end) <= 24):
            problems.add(f"{where}.prices.windows[{index}].hours must read START-END in UTC hours "
                         f"(22-6), not {hours!r}.")
            continue
        windows.append(TimeWindow(float(start), float(end), problems.number(
            f"{where}.prices.windows[{index}].multiplier", window.get("multiplier"))))
    book = PriceBook(per_device_hour={"gpu": problems.number(f"{where}.prices.gpu_hour",
                                                             entry.get("gpu_hour", 0.0))},
                     windows=tuple(windows))
    return book, str(entry.get("currency", "USD"))


def _links(problems: _Problems, raw: Any, regions: set[str]) -> dict[tuple[str, str], Link]:
    links: dict[tuple[str, str], Link] = {}
    if not isinstance(raw, dict):
        problems.add("regions must map each region to the others: "
                     "REGION: {OTHER: {bandwidth_gbps, latency_ms}}.")
        return links
    for src, targets in raw.items():
        if src not in regions:
            problems.add(f"regions names {src!r}, the region of no member; use one of "
                         f"{', '.join(sorted(regions))}.{did_you_mean(str(src), sorted(regions))}")
        for dst, spec in (targets or {}).items() if isinstance(targets, dict) else []:
            where = f"regions.{src}.{dst}"
            if dst not in regions:
                problems.add(f"{where} names {dst!r}, the region of no member."
                             f"{did_you_mean(str(dst), sorted(regions))}")
            entry = problems.keys(where, spec, _LINK)
            link = Link(problems.number(f"{where}.bandwidth_gbps", entry.get("bandwidth_gbps"),
                                        positive=True),
                        problems.number(f"{where}.latency_ms", entry.get("latency_ms", 0.0)))
            links[(str(src), str(dst))] = link
            links.setdefault((str(dst), str(src)), link)
    return links
