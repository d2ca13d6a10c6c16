"""Per-pod network namespaces: a pod reaches the pods of its own tenant, the pool's published
services (its API server) and the node's declared networks, and nothing else.

Each pod of another Unix account gets its own network namespace (`ip netns add`), joined by the
launcher's account helper (setns, before it drops to the pod's uid; launcher.py), with one veth pair to the
host. The host routes every pod's /32 through its veth (proxy ARP answers for the node's gateway):
there is no layer-2 segment between pods, so every packet between two pods, or from a pod to
anywhere, crosses the host's forward (or input) hook, where one nftables table, `inet gpupool_net`,
decides:

- a pod's packet must carry its own address (the set `pod_ifs`: interface . address);
- to a gang's rendezvous port (the rank-0 pod's address . MASTER_PORT, map `gang_guard`) only from
  the gang's pods (set `gm_<gang>`);
- then to the pods of the same tenant (set `ta_<tenant>`, chain `t_<tenant>`), and through the
  node's own chains (`s_<node>_fwd`, rewritten at each start) to the declared networks and the
  published services; everything else is dropped;
- into a pod only the answers to what it opened, and what its tenant's pods send it (from the host's
  own processes too: only answers);
- to the host itself only the published services (a loopback one through DNAT from the node's
  gateway, as GPUPOOL_URL then names it);
- a service replica on a Ray node (`set_servers`): the node's own address at its serve port is
  DNATed to it for connections from the server's addresses only (map `serve_dnat`, set
  `serve_from`), so the router on the server's machine reaches it at the node's address; on the
  server's machine, pods do not reach the other machines' node addresses (`s_<node>_peers`).

The node's pods live in one /19 of the pool's pod network (its `slot`): the rank-0 pod of a gang gets
the address the gang's MASTER_PORT names (GANG_HOSTS + (port - GANG_PORT_BASE) mod GANG_PORT_COUNT),
so the server knows MASTER_ADDR before the pod starts; other pods take the lowest free address from
OTHER_HOSTS up. The pool's gang range (`gangs.port_base`, `port_count`, at most GANG_PORT_COUNT ports
in a row) gives each of its ports an address of its own whatever its base, so an agent needs no
setting of the pool's for it, and the default range (29500-31499) maps as it always has.
Every simulated node of a local pool has its own slot, gateway device and routes on the same host:
a gang spread over them meets through the host's routing, filtered by the same table. A Ray
machine's slot is handed out by the server when it joins (providers/ray/network.py); the other
machines' slots are routed through their node addresses (`set_routes`), and their pods, announced
by their agents before they start (`add_remote`), are in the set `remote` and their tenants' (and
gangs') sets: a packet from another machine is let in (chain `from_remote`) only from an announced
pod, to its tenant's pods and past the gang guard, and traffic between pods is never masqueraded.

A worker thread keeps SPARES namespaces made ahead (addressed and routed, no rules), so a launch
only adds its elements (one nft transaction), and tears down the networks of the pods that ended
(NodeAgent.poll hands them over) in batches, off the poll's path. The namespace of a pod that ended
alone (not of a gang) with no process left in it is kept instead, with its address and elements, for
the next pod of the same tenant (the same Unix account), which then needs no `ip` or `nft` at all:
at most KEPT per node, the oldest torn down first. It never goes to another tenant. At start the agent sweeps
whatever of its /19 no live pod holds (a crash's leftovers, old spares). An agent holds its /19 by
a lock file for its lifetime; sweeps and teardowns also take one host-wide lock file.

InfiniBand (RDMA) traffic does not pass through the namespace: it stays partitioned by PKey.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from gpupool.agent.identity import ensure_router_account
from gpupool.errors import InvalidInput, ProviderError

log = logging.getLogger("gpupool.agent")
NETNS_ENV = "GPUPOOL_POD_NETNS"
POD_NETWORK_ENV = "GPUPOOL_POD_NETWORK"
REACHABLE_ENV = "GPUPOOL_POD_REACHABLE"
DEFAULT_POD_NETWORK = "10.224.0.0/11"
NODE_PREFIX = 19
"""Each node's pods take one /19 of the pod network (8190 addresses)."""
GANG_HOSTS = 16
GANG_PORT_BASE = 29_500
GANG_PORT_COUNT = 2_000
"""Rendezvous addresses: port p maps to GANG_HOSTS + (p - GANG_PORT_BASE) mod GANG_PORT_COUNT (the
config's GANG_ADDRESSES bounds gangs.port_count to this many, so no two ports of a range share one)."""
OTHER_HOSTS = GANG_HOSTS + GANG_PORT_COUNT + 32
TABLE = "gpupool_net"
LOCK_PATH = Path("/run/gpupool-net.lock")
NETNS_DIR = Path("/run/netns")
_NAME = re.compile(r"^gpn-[0-9a-f]{5}-[0-9a-f]{8}$")
_TIMEOUT_S = 20.0
SPARES = 4
"""Namespaces each node keeps made ahead, so a launch only adds its rules (netns.py, PodNetwork)."""
KEPT = 32
"""Namespaces of ended pods each node keeps for their tenants' next pods (netns.py, PodNetwork)."""
POD_CONNECTIONS = 8192
"""The most connections the kernel tracks for one pod's address at a time (new ones past it are
dropped): the node's table is shared (262,144 entries on a common host), and a pod that filled it,
which one did with 40,000 UDP flows in 0.17 s, would have every other pod's new connections dropped."""
POD_CONNS = "pod_conns"
"""The dynamic set counting each pod address's connections (`POD_CONNECTIONS`); its elements are the
kernel's, made and dropped with the connections, so the agent's sweeps leave them alone."""
JUDGE_WAIT_S = 2.0
"""How long a launch waits for the worker to say whether its tenant's ended pod's namespace can be
kept (a /proc scan, milliseconds) before it makes one anew."""
_DEFAULT_NETWORK = ipaddress.IPv4Network(DEFAULT_POD_NETWORK)


class NetnsMode(StrEnum):
    AUTO = "auto"
    """On where the agent is root and `ip` and `nft` work; else off, said in `node ls`."""
    ON = "on"
    """On, or the agent refuses to start."""
    OFF = "off"


@dataclass(frozen=True, slots=True)
class NetworkSettings:
    """The operator's choice: GPUPOOL_POD_NETNS, GPUPOOL_POD_NETWORK, GPUPOOL_POD_REACHABLE."""

    mode: NetnsMode = NetnsMode.AUTO
    pod_network: ipaddress.IPv4Network = _DEFAULT_NETWORK
    reachable: tuple[ipaddress.IPv4Network, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> NetworkSettings:
        """Read the settings; InvalidInput names the variable and what it takes."""
        env = os.environ if environ is None else environ
        raw_mode = env.get(NETNS_ENV, "").strip().lower() or NetnsMode.AUTO.value
        try:
            mode = NetnsMode(raw_mode)
        except ValueError:
            raise InvalidInput(f"{NETNS_ENV}={raw_mode[:40]!r} is not one of auto, on, off; unset it for "
                               "auto (pods get network namespaces where the agent can make them).") from None
        raw_net = env.get(POD_NETWORK_ENV, "").strip() or DEFAULT_POD_NETWORK
        try:
            network = ipaddress.IPv4Network(raw_net)
        except ValueError:
            raise InvalidInput(f"{POD_NETWORK_ENV}={raw_net[:60]!r} is not an IPv4 network such as "
                               f"{DEFAULT_POD_NETWORK}; unset it for that default.") from None
        if network.prefixlen > NODE_PREFIX:
            raise InvalidInput(f"{POD_NETWORK_ENV}={raw_net!r} is smaller than one node's /{NODE_PREFIX}; "
                               f"give a /{NODE_PREFIX} or larger, such as {DEFAULT_POD_NETWORK}.")
        reachable = []
        for part in filter(None, (p.strip() for p in env.get(REACHABLE_ENV, "").split(","))):
            try:
                reachable.append(ipaddress.IPv4Network(part, strict=False))
            except ValueError:
                raise InvalidInput(f"{REACHABLE_ENV}: {part[:60]!r} is not an IPv4 network; write the "
                                   "node's declared networks as comma-separated CIDRs, such as "
                                   "'10.0.0.0/16,192.168.7.0/24'.") from None
        return cls(mode, network, tuple(reachable))


@dataclass(frozen=True, slots=True)
class _Spare:
    """A namespace with its veth, address and host route, and no rules (no process in it yet)."""

    netns: str
    veth: str
    address: str


@dataclass(frozen=True, slots=True)
class PodNet:
    """One pod's attachment, kept in its record (PodRecord.net) for the teardown after a restart."""

    pod_id: str
    netns: str
    veth: str
    address: str
    tenant_key: str
    gang_key: str = ""
    gang_port: int = 0
    """The rendezvous port this pod (rank 0) serves, guarded for its gang; 0: none."""
    serve_port: int = 0
    """A service replica's port, open to the node's own processes (set `serve_ports`); 0: none."""
    servers: tuple[str, ...] = ()
    """A replica on a Ray node: the server's addresses, whose connections to the node's own address
    at `serve_port` are taken to this pod (map `serve_dnat`, set `serve_from`); (): none."""

    def member(self) -> Member:
        return Member(self.address, self.tenant_key, self.gang_key)

    def to_json(self) -> str:
        return json.dumps({"pod_id": self.pod_id, "netns": self.netns, "veth": self.veth,
                           "address": self.address, "tenant_key": self.tenant_key,
                           "gang_key": self.gang_key, "gang_port": self.gang_port,
                           "serve_port": self.serve_port, "servers": list(self.servers)})

    @classmethod
    def from_json(cls, text: str) -> PodNet | None:
        try:
            data = json.loads(text)
            net = cls(str(data["pod_id"]), str(data["netns"]), str(data["veth"]), str(data["address"]),
                      str(data["tenant_key"]), str(data.get("gang_key", "")), int(data.get("gang_port", 0)),
                      int(data.get("serve_port", 0)),
                      tuple(str(ipaddress.IPv4Address(a)) for a in data.get("servers", ())))
        except (ValueError, KeyError, TypeError):
            return None
        return net if _NAME.match(net.netns) else None


@dataclass(frozen=True, slots=True)
class Member:
    """A pod as the other machines' tables know it: its address, tenant and gang."""

    address: str
    tenant_key: str
    gang_key: str = ""


Announce = Callable[[Sequence[Member], Sequence[str]], None]
"""Tells the other machines' agents of this machine's pods that were attached (before they start)
and of the addresses given up (Ray nodes: providers/ray/network.py)."""


def _key(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:10]


def gang_key(workload_id: str, master_addr: str, master_port: int) -> str:
    return _key("gang", workload_id, master_addr, str(master_port))


def tenant_key(tenant: str, pod_network: ipaddress.IPv4Network | str) -> str:
    """The key of `tenant`'s chain and set in the host's table, per pool (its pod network): two pools
    on one machine share the table, and a tenant named alike in the other pool is another tenant."""
    return _key("tenant", str(pod_network), tenant)


def blocks_in(pod_network: ipaddress.IPv4Network) -> int:
    """How many machines' blocks (/19) the pod network holds."""
    return 2 ** (NODE_PREFIX - pod_network.prefixlen)


def gang_address_in(subnet: ipaddress.IPv4Network, port: int) -> str:
    """The address of the rank-0 pod serving rendezvous port `port` in the block `subnet` ('' for
    port 0, none): known before the pod starts, anywhere. Ports GANG_PORT_COUNT apart share one, so
    a pool's gang range (at most that many ports in a row) never gives two of its ports one."""
    if port <= 0:
        return ""
    return str(subnet.network_address + GANG_HOSTS + (port - GANG_PORT_BASE) % GANG_PORT_COUNT)


def node_subnet(pod_network: ipaddress.IPv4Network, slot: int) -> ipaddress.IPv4Network:
    """The `slot`-th /19 of the pod network. InvalidInput when the network has no such slot."""
    subnets = 2 ** (NODE_PREFIX - pod_network.prefixlen)
    if not 0 <= slot < subnets:
        raise InvalidInput(f"Pod network {pod_network} holds {subnets} node(s) of /{NODE_PREFIX}; node slot "
                           f"{slot} does not fit: give {POD_NETWORK_ENV} a larger network.")
    return ipaddress.IPv4Network((int(pod_network.network_address) + slot * 2 ** (32 - NODE_PREFIX),
                                  NODE_PREFIX))


_TOOLS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""Where the network tools (ip, nft, conntrack) are looked up, whatever the agent's own PATH."""


def _run(argv: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=_TIMEOUT_S,
                          check=False, env={"PATH": _TOOLS_PATH, "LC_ALL": "C"})


CONNTRACK = "conntrack"
"""conntrack-tools' program (Debian's `conntrack`): deletes the kernel's connection entries."""


def _conntrack() -> str | None:
    return shutil.which(CONNTRACK, path=_TOOLS_PATH)


def forget_connections(addresses: Iterable[str]) -> None:
    """Delete the kernel's connection-tracking entries from and to these pod addresses, which are
    free again: the rules accept a packet of an established connection before any tenant check, so
    the next pod given the address (another tenant's, perhaps) would otherwise inherit the last
    one's connections (a UDP flow stays established for as long as either side keeps it busy).
    Without the program it cannot be done: said at the start (`PodNetwork.start`)."""
    tool = _conntrack()
    if tool is None:
        return
    for address in addresses:
        if address:
            for side in ("--orig-src", "--orig-dst"):  # (exit status 1: there was none)
                _run([tool, "-D", side, address])


def _must(argv: Sequence[str], stdin: str | None = None) -> None:
    done = _run(argv, stdin)
    if done.returncode != 0:
        what = (done.stderr or done.stdout).strip().splitlines()
        raise ProviderError(f"Network isolation: `{' '.join(argv[:4])}` failed: "
                            f"{what[0] if what else f'exit status {done.returncode}'}")


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def probe() -> str:
    """Why this machine cannot give pods network namespaces ('' when it can)."""
    if os.geteuid() != 0:
        return "the agent does not run as root (no CAP_NET_ADMIN), so pods share the node's network"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool, path=_TOOLS_PATH) is None:
            return f"`{tool}` is not installed (package {package}), so pods share the node's network"
    done = _run(["nft", "list", "tables"])
    if done.returncode != 0:
        why = (done.stderr or "").strip()[:80]
        return f"nftables does not answer ({why}), so pods share the node's network"
    return ""


class PodNetwork:
    """One node's pod network: its slot of the pool's pod network, its gateway, its pods, and a
    worker thread that tears ended pods' networks down and makes spare namespaces."""

    def __init__(self, settings: NetworkSettings, slot: int = 0,
                 published: Iterable[tuple[str, int]] = ()) -> None:
        self.settings = settings
        self.slot = slot
        self.subnet = node_subnet(settings.pod_network, slot)
        self.gateway = str(self.subnet.network_address + 1)
        self.key = _key("subnet", str(self.subnet))[:5]
        """Names this node's namespaces (gpn-KEY-RANDOM), veths (gvKEYRANDOM), gateway (gpbKEY) and
        chains (s_KEY_*)."""
        self.bridge = f"gpb{self.key}"
        self._claim = -1
        self.published = tuple((host, int(port)) for host, port in published)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._live: dict[str, PodNet] = {}
        self._pending: dict[str, PodNet] = {}
        """Pods detached whose teardown the worker has not finished."""
        self.kept_limit = KEPT
        self._to_keep: dict[str, PodNet] = {}
        """Pods detached whose namespace may be kept once the worker has seen no process left in it."""
        self._kept: dict[str, PodNet] = {}
        """Namespaces kept for their tenant's next pod (by the pod id they last held, oldest first)."""
        self._worker: threading.Thread | None = None
        self._stopping = False
        self.spares = SPARES
        self._spares: list[_Spare] = []
        """Namespaces made ahead by the worker, each with its veth, address and route."""
        self._making: set[str] = set()
        """The address of the spare the worker is making."""
        self.announce: Announce | None = None
        """Told of pods attached and addresses given up, for the other machines' tables."""
        self.servers: tuple[str, ...] = ()
        """The server's addresses (a Ray node's plan): a service replica attached here is reached at
        the node's own address from these only (`set_servers`); (): replicas get no such port."""
        self._routes: dict[str, str] = {}
        """Other machines' blocks (CIDR) -> the node address they are routed through."""
        self._remote: dict[str, Member] = {}
        """The other machines' pods (by address) in this machine's table (those an earlier agent
        added too: `start` reads them back)."""
        self._told_lock = threading.Lock()
        self._told: dict[str, tuple[str, dict[str, int]]] = {}
        """Each other machine's node -> (its agent's incarnation, address -> the number of the last
        word of that agent on it): `told` applies what it says in its order."""
        self._retired: set[str] = set()
        """Incarnations of other machines' agents that were followed by another (ignored)."""
        self._tenants: set[str] = set()
        self._gangs: set[str] = set()
        """Tenants and gangs whose chains this agent has made (a launch then adds elements only)."""
        why = "" if settings.mode is NetnsMode.OFF else probe()
        if settings.mode is NetnsMode.OFF:
            why = f"off ({NETNS_ENV}=off): pods share the node's network"
        if why and settings.mode is NetnsMode.ON:
            raise InvalidInput(f"{NETNS_ENV}=on, but {why}; run the agent as root with iproute2 and "
                               "nftables installed, or set it to auto.")
        self.unavailable = why
        """Why pods share the node's network ('' when each gets its own namespace)."""

    @property
    def active(self) -> bool:
        return not self.unavailable

    @property
    def detail(self) -> str:
        if not self.active:
            return self.unavailable
        reach = ", ".join(str(n) for n in self.settings.reachable) or "none"
        services = ", ".join(f"{host}:{port}" for host, port in self.published) or "none"
        stale = ("" if _conntrack() else
                 "; conntrack is not installed, so a freed pod address keeps its last pod's connections "
                 "until they time out, for the next pod given it (apt-get install conntrack)")
        return (f"a network namespace per pod in {self.subnet}: it reaches its tenant's pods, the pool's "
                f"API server ({services}) and the declared networks ({reach}), nothing else{stale}")

    # ---- the host's side -------------------------------------------------------------------
    @contextlib.contextmanager
    def _host_lock(self) -> Iterator[None]:
        LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield None
        finally:
            os.close(fd)

    def _published_local(self) -> list[int]:
        return sorted({port for host, port in self.published if ipaddress.ip_address(host).is_loopback})

    def _published_remote(self) -> list[tuple[str, int]]:
        return sorted({(host, port) for host, port in self.published
                       if not ipaddress.ip_address(host).is_loopback})

    def _table_batch(self) -> str:
        """The host's table, its sets and its base chains with their rules."""
        t = f"inet {TABLE}"
        return "\n".join([
            f"add table {t}",
            f"add set {t} pods {{ type ipv4_addr; }}",
            f"add set {t} pod_ifs {{ type ifname . ipv4_addr; }}",
            f"add map {t} src_tenant {{ type ipv4_addr : verdict; }}",
            f"add map {t} gang_guard {{ type ipv4_addr . inet_service : verdict; }}",
            f"add set {t} serve_ports {{ type ipv4_addr . inet_service; }}",
            f"add set {t} remote {{ type ipv4_addr; }}",
            f"add map {t} serve_dnat {{ type inet_service : ipv4_addr; }}",
            f"add set {t} serve_from {{ type ipv4_addr . inet_service; }}",
            f"add set {t} {POD_CONNS} {{ type ipv4_addr; flags dynamic; size 65535; }}",
            *(f"add map {t} {name} {{ type ipv4_addr : verdict; flags interval; }}"
              for name in ("slot_fwd", "slot_in", "slot_nat")),
            f"add chain {t} forward {{ type filter hook forward priority 0; policy accept; }}",
            f"add chain {t} input {{ type filter hook input priority 0; policy accept; }}",
            f"add chain {t} output {{ type filter hook output priority 0; policy accept; }}",
            f"add chain {t} prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}",
            f"add chain {t} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}",
            f"add chain {t} nat_output {{ type nat hook output priority -100; policy accept; }}",
            f"add chain {t} from_pod", f"add chain {t} pod_input", f"add chain {t} from_remote",
            *(f"flush chain {t} {c}" for c in ("forward", "input", "output", "prerouting", "postrouting",
                                               "nat_output", "from_pod", "pod_input", "from_remote")),
            f'add rule {t} forward iifname "gv*" jump from_pod',
            f'add rule {t} forward oifname "gv*" ct state established,related accept',
            # a service replica on a Ray node: the server's connection to the node's own address at
            # the replica's port, taken to the replica by the DNAT below (from the server's
            # addresses only, element `server . port` of `serve_from`, added at the attach)
            (f'add rule {t} forward oifname "gv*" ct status dnat ip saddr . tcp dport @serve_from '
             "ip daddr . tcp dport @serve_ports accept"),
            # a pod of another machine (set `remote`, told by its agent) reaches a pod here as a pod
            # of this machine would: its gang's rendezvous, its tenant's pods; its own machine
            # checked that it sends with its own address
            f'add rule {t} forward oifname "gv*" ip saddr @remote jump from_remote',
            f'add rule {t} forward oifname "gv*" drop',
            f"add rule {t} from_remote meta l4proto {{ tcp, udp }} ip daddr . th dport vmap @gang_guard",
            f"add rule {t} from_remote ip saddr vmap @src_tenant",
            f"add rule {t} from_remote drop",
            f"add rule {t} from_pod ct state established,related accept",
            f"add rule {t} from_pod iifname . ip saddr != @pod_ifs drop",
            (f"add rule {t} from_pod ct state new add @{POD_CONNS} "
             f"{{ ip saddr ct count over {POD_CONNECTIONS} }} drop"),
            f"add rule {t} from_pod meta l4proto {{ tcp, udp }} ip daddr . th dport vmap @gang_guard",
            f"add rule {t} from_pod ip saddr vmap @src_tenant",
            f"add rule {t} from_pod ip saddr vmap @slot_fwd",
            f"add rule {t} from_pod drop",
            f'add rule {t} input iifname "gv*" jump pod_input',
            # the host's own processes (other users, pods of a pool without namespaces) reach a pod
            # only with the answers to what it opened
            f'add rule {t} output oifname "gv*" ct state established,related accept',
            # ... and a service replica's port, to the pool's own identity and its router's account
            # only: its probes and HAProxy's workers open connections to it; other users' do not
            (f'add rule {t} output oifname "gv*" meta skuid {{ {_router_uids()} }} '
             "ip daddr . tcp dport @serve_ports accept"),
            f'add rule {t} output oifname "gv*" drop',
            f"add rule {t} pod_input ct state established,related accept",
            f"add rule {t} pod_input iifname . ip saddr != @pod_ifs drop",
            (f"add rule {t} pod_input ct state new add @{POD_CONNS} "
             f"{{ ip saddr ct count over {POD_CONNECTIONS} }} drop"),
            f"add rule {t} pod_input ip saddr vmap @slot_in",
            f"add rule {t} pod_input drop",
            f'add rule {t} prerouting iifname "gv*" ip saddr vmap @slot_nat',
            *(f"add rule {t} {chain} fib daddr type local ip saddr . tcp dport @serve_from "
              "dnat ip to tcp dport map @serve_dnat" for chain in ("prerouting", "nat_output")),
            f"add rule {t} postrouting ip saddr @pods ip daddr != @pods ip daddr != @remote masquerade",
        ]) + "\n"

    def _slot_batch(self) -> str:
        """This node's own chains: what its pods reach besides their tenant's pods (the published
        services, the declared networks), rewritten at every start, so a setting taken away goes."""
        t, n = f"inet {TABLE}", f"s_{self.key}"
        lines = []
        for kind in ("fwd", "in", "nat"):
            lines += [f"add chain {t} {n}_{kind}", f"flush chain {t} {n}_{kind}",
                      f"add element {t} slot_{kind} {{ {self.subnet} : jump {n}_{kind} }}"]
        local = self._published_local()
        if local:
            ports = ", ".join(map(str, local))
            lines += [f"add rule {t} {n}_nat fib daddr type local tcp dport {{ {ports} }} "
                      "dnat ip to 127.0.0.1",
                      f"add rule {t} {n}_in ip daddr 127.0.0.1 tcp dport {{ {ports} }} accept"]
        for host, port in self._published_remote():  # on this machine (input) or another (forward)
            lines += [f"add rule {t} {n}_in ip daddr {host} tcp dport {port} accept",
                      f"add rule {t} {n}_fwd ip daddr {host} tcp dport {port} accept"]
        # on the server's machine, a pod masqueraded to its address would pass for the server at
        # the other machines' replicas' ports (serve_from): the other machines' node addresses are
        # not reached from pods there, declared networks or not (set by `_guard_peers`)
        lines += [f"add set {t} {n}_peers {{ type ipv4_addr; }}",
                  f"add rule {t} {n}_fwd ip daddr @{n}_peers drop"]
        if self.settings.reachable:
            networks = ", ".join(map(str, self.settings.reachable))
            lines.append(f"add rule {t} {n}_fwd ip daddr {{ {networks} }} accept")
        return "\n".join(lines) + "\n"

    def start(self, live: Mapping[str, PodNet]) -> None:
        """Make the node's gateway and the host table (when missing), then sweep what no live pod
        holds. `live`: the attachments of the pods still running (re-adopted)."""
        if not self.active:
            return
        if not self._take_claim():
            return
        with self._host_lock():
            # the base chains are flushed and written again in one transaction (this version's
            # rules); the sets and maps, which hold the other agents' pods, are kept
            if _run(["nft", "-f", "-"], self._table_batch() + self._slot_batch()).returncode != 0:
                # a machine's first table: a kernel may refuse an interval map's jumps in the
                # transaction that makes the map ("No such file or directory", Linux 6.18), and
                # nothing is enforced before the table exists: the map first, then its elements
                _must(["nft", "-f", "-"], self._table_batch())
                _must(["nft", "-f", "-"], self._slot_batch())
            if not Path(f"/sys/class/net/{self.bridge}").exists():
                _must(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{self.gateway}/32", "dev", self.bridge])  # already there: fine
            _must(["ip", "link", "set", self.bridge, "up"])
            _write("/proc/sys/net/ipv4/ip_forward", "1")
            with self._lock:
                self._live = dict(live)
            self._sweep()
        with self._lock:
            self._wake_worker()  # makes the spares

    def _take_claim(self) -> bool:
        """Hold this node's subnet for the agent's life (a lock file): a second agent on the same
        subnet would sweep the first one's pods. In auto mode the second runs its pods without
        namespaces (said in `node ls`); with `on` it refuses to start."""
        LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
        claim = LOCK_PATH.with_name(f"gpupool-net-{self.key}.lock")
        fd = os.open(claim, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            why = (f"another agent on this machine uses the pod network {self.subnet}, so pods share the "
                   f"node's network; give each pool on a machine its own {POD_NETWORK_ENV}")
            if self.settings.mode is NetnsMode.ON:
                raise InvalidInput(f"{NETNS_ENV}=on, but {why}.") from None
            self.unavailable = why
            return False
        self._claim = fd
        return True

    def publish(self, services: Iterable[tuple[str, int]]) -> None:
        """Make `services` (IPv4 address, port) the published services pods reach, in place of
        those given at construction (for a server that learns its port after its agents start)."""
        self.published = tuple((str(ipaddress.IPv4Address(host)), int(port)) for host, port in services)
        if self.active and self._claim >= 0:
            with self._host_lock():
                _must(["nft", "-f", "-"], self._slot_batch())

    def set_servers(self, servers: Iterable[str]) -> None:
        """The server's addresses (where the pool's router and probes connect from): a replica
        gets the node's own address at its serve port, from these only (the live replicas' too,
        when they change: a new leader on another machine). On a machine that holds one of them,
        pods do not reach the other machines' node addresses."""
        wanted = tuple(sorted({str(ipaddress.IPv4Address(a)) for a in servers}))
        t = f"inet {TABLE}"
        added: list[str] = []
        removed: list[str] = []
        with self._lock:
            self.servers = wanted
            for net in list(self._live.values()):
                if not net.servers or net.servers == wanted or not wanted:
                    continue
                port = net.serve_port
                added += [f"add element {t} serve_from {{ {a} . {port} }}" for a in wanted]
                removed += [f"delete element {t} serve_from {{ {a} . {port} }}"
                            for a in net.servers if a not in wanted]
                self._live[net.pod_id] = replace(net, servers=wanted)
        if added and self.active:
            _must(["nft", "-f", "-"], "\n".join(added) + "\n")
            if removed and _run(["nft", "-f", "-"], "\n".join(removed) + "\n").returncode != 0:
                for line in removed:  # some were gone already (a restarted agent's record is older)
                    _run(["nft", "-f", "-"], line + "\n")
        self._guard_peers()

    def _guard_peers(self) -> None:
        """Fill this node's set `s_KEY_peers`: the other machines' node addresses where this machine
        holds a server address (a pod masqueraded to it would pass for the server there), else none."""
        if not self.active or self._claim < 0:
            return
        with self._lock:
            vias = sorted(set(self._routes.values()))
        if not any(_is_local(a) for a in self.servers):
            vias = []
        t, name = f"inet {TABLE}", f"s_{self.key}_peers"
        lines = [f"flush set {t} {name}"]
        if vias:
            lines.append(f"add element {t} {name} {{ {', '.join(vias)} }}")
        _must(["nft", "-f", "-"], "\n".join(lines) + "\n")

    def pod_address(self, pod_id: str) -> str:
        """The address of a pod running here in its own namespace ('' when it has none)."""
        with self._lock:
            net = self._live.get(pod_id)
        return net.address if net is not None else ""

    def gang_address(self, port: int) -> str:
        """The address of the rank-0 pod that serves rendezvous port `port` here ('' when off)."""
        return gang_address_in(self.subnet, port) if self.active else ""

    def _addresses_held(self) -> set[str]:
        """Every address this node's pods, kept namespaces and spares hold (under the lock)."""
        nets = (*self._live.values(), *self._pending.values(), *self._to_keep.values(), *self._kept.values())
        return {net.address for net in nets} | {spare.address for spare in self._spares} | self._making

    def _address_for(self, gang_port: int) -> str:
        """A free address (under the lock); a pod being torn down still holds its own."""
        taken = self._addresses_held()
        if gang_port:
            address = self.gang_address(gang_port)
            if address in {net.address for net in self._pending.values()}:  # the port's last holder
                deadline = time.monotonic() + _TIMEOUT_S
                while address in {net.address for net in self._pending.values()} and (
                        time.monotonic() < deadline):
                    self._changed.wait(deadline - time.monotonic())
                taken = self._addresses_held()
            if address in taken:
                raise ProviderError(f"Network isolation: the rendezvous address {address} is still held by "
                                    "an earlier pod on this node; the gang is retried once it has ended.")
            return address
        base = int(self.subnet.network_address)
        for host in range(OTHER_HOSTS, self.subnet.num_addresses - 1):
            address = str(ipaddress.IPv4Address(base + host))
            if address not in taken:
                return address
        raise ProviderError(f"Network isolation: every pod address of {self.subnet} is in use on this node.")

    def attach(self, pod_id: str, tenant: str, *, rank: int = 0, world_size: int = 1, workload_id: str = "",
               master_addr: str = "", master_port: int = 0, serve_port: int = 0) -> PodNet:
        """Make the pod's namespace, veth, routes and rules; returns its attachment (idempotent by
        pod id). ProviderError when the host refuses (the pod is not started)."""
        with self._lock:
            known = self._live.get(pod_id)
            if known is not None:
                return known
            serves = master_port if rank == 0 and world_size > 1 else 0
            gang = gang_key(workload_id, master_addr, master_port) if world_size > 1 and master_port else ""
            servers = self.servers if serve_port else ()
            if servers:
                self._port_free(serve_port)
            owner = tenant_key(tenant, self.settings.pod_network)
            kept = self._take_kept(owner) if not gang and not serve_port else None
            if kept is not None:  # its address and elements are in place already
                net = PodNet(pod_id=pod_id, netns=kept.netns, veth=kept.veth, address=kept.address,
                             tenant_key=kept.tenant_key)
                self._live[pod_id] = net
                return net
            spare = self._spares.pop() if self._spares and not serves else None
            if spare is None:  # a rank 0 (its address is its port's), or none made ahead: made now
                spare = _Spare(*self._names(), self._address_for(serves))
            net = PodNet(pod_id=pod_id, netns=spare.netns, veth=spare.veth, address=spare.address,
                         tenant_key=owner, gang_key=gang, gang_port=serves,
                         serve_port=serve_port, servers=servers)
            self._live[pod_id] = net
            self._wake_worker()  # to make the next spare
        mapped = False
        try:
            if not (NETNS_DIR / net.netns).exists():
                self._create(spare)
            # A tenant this agent has seen has its chain: the pod's elements alone, in the usual case
            # (where another agent's sweep removed the chain meanwhile, the batch fails, and is
            # made whole).
            seen = net.tenant_key in self._tenants and (not net.gang_key or net.gang_key in self._gangs)
            if not seen or _run(["nft", "-f", "-"], self._add_rules(net, chains=False)).returncode != 0:
                _must(["nft", "-f", "-"], self._add_rules(net))
            with self._lock:
                self._tenants.add(net.tenant_key)
                if net.gang_key:
                    if len(self._gangs) >= 100_000:  # a long-lived agent's gangs: forget the old
                        self._gangs.clear()
                    self._gangs.add(net.gang_key)
            if net.servers:  # one transaction: the port taken (by another agent here) adds nothing
                done = _run(["nft", "-f", "-"], self._serve_rules(net))
                if done.returncode != 0:
                    raise ProviderError(f"Network isolation: port {net.serve_port} of this node is taken "
                                        "to another pod already (a replica of another pool on this "
                                        "machine); give the services different ports.")
                mapped = True
            if self.announce is not None and self._routes:  # the other machines learn it first
                self.announce([net.member()], [])
        except BaseException as exc:
            with self._lock:
                self._live.pop(pod_id, None)
            with self._host_lock():
                self._remove_links(net)
                self._remove_rules(net if mapped else replace(net, servers=()))
            if isinstance(exc, OSError):
                raise ProviderError(f"Network isolation: the pod's network could not be set up ({exc}); "
                                    "it was not started.") from None
            raise
        return net

    def _port_free(self, port: int) -> None:
        """Wait (under the lock) for an ended replica's teardown to give up the node's `port`;
        ProviderError when a live replica here holds it."""
        def holder() -> PodNet | None:
            return next((n for n in (*self._live.values(), *self._pending.values())
                         if n.servers and n.serve_port == port), None)

        deadline = time.monotonic() + _TIMEOUT_S
        while (held := holder()) is not None and held.pod_id in self._pending and time.monotonic() < deadline:
            self._changed.wait(deadline - time.monotonic())
        if held is not None:
            raise ProviderError(f"Network isolation: port {port} of this node is served by replica "
                                f"{held.pod_id} already, and a Ray node takes one replica a port to "
                                "itself; this one is not started here.")

    def _take_kept(self, owner: str) -> PodNet | None:
        """A namespace kept for tenant `owner` (under the lock), taken out of the kept ones. While
        the worker judges one of the tenant's ended pods' namespaces (it reads /proc), its verdict is
        waited for (JUDGE_WAIT_S at most): cheaper than a namespace made anew."""
        deadline = time.monotonic() + JUDGE_WAIT_S
        while True:
            kept = next((k for k in self._kept.values() if k.tenant_key == owner), None)
            if kept is not None:
                del self._kept[kept.pod_id]
                return kept
            left = deadline - time.monotonic()
            if left <= 0 or not any(k.tenant_key == owner for k in self._to_keep.values()):
                return None
            self._changed.wait(left)

    def _names(self) -> tuple[str, str]:
        """A fresh namespace's and veth's names (gpn-NODE-RANDOM, gvNODERANDOM)."""
        key = os.urandom(4).hex()
        return f"gpn-{self.key}-{key}", f"gv{self.key}{key}"

    def _wake_worker(self) -> None:
        """Start the worker (under the lock) and tell it something changed."""
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="gpupool-netns", daemon=True)
            self._worker.start()
        self._changed.notify_all()

    def _create(self, net: _Spare) -> None:
        """Two programs: the host's side (namespace, veth, route), then the pod's side."""
        _must(["ip", "-batch", "-"], f"netns add {net.netns}\n"
              f"link add {net.veth} type veth peer name eth0 netns {net.netns}\n"
              f"link set {net.veth} up\nroute add {net.address}/32 dev {net.veth}\n")
        for name, value in (("proxy_arp", "1"), ("route_localnet", "1")):
            _write(f"/proc/sys/net/ipv4/conf/{net.veth}/{name}", value)
        with contextlib.suppress(OSError):
            _write(f"/proc/sys/net/ipv6/conf/{net.veth}/disable_ipv6", "1")
        _must(["ip", "-n", net.netns, "-batch", "-"],
              "link set lo up\nlink set eth0 up\n"
              f"addr add {net.address}/32 dev eth0\n"
              f"route add {self.gateway}/32 dev eth0 scope link\n"
              f"route add default via {self.gateway} dev eth0\n")

    def _add_rules(self, net: PodNet, *, chains: bool = True) -> str:
        """The pod's elements; with `chains`, first its tenant's (and gang's) set and chain, made
        or remade (a flush and its rules in one transaction: idempotent)."""
        t = f"inet {TABLE}"
        tc, ta = f"t_{net.tenant_key}", f"ta_{net.tenant_key}"
        lines = [
            f"add set {t} {ta} {{ type ipv4_addr; }}",
            f"add chain {t} {tc}", f"flush chain {t} {tc}",
            f"add rule {t} {tc} ip daddr @{ta} accept",
        ] if chains else []
        lines += [
            f"add element {t} {ta} {{ {net.address} }}",
            f"add element {t} pods {{ {net.address} }}",
            f'add element {t} pod_ifs {{ "{net.veth}" . {net.address} }}',
            f"add element {t} src_tenant {{ {net.address} : jump {tc} }}",
        ]
        if net.gang_key:
            gc, gm = f"g_{net.gang_key}", f"gm_{net.gang_key}"
            if chains:
                lines += [f"add set {t} {gm} {{ type ipv4_addr; }}",
                          f"add chain {t} {gc}", f"flush chain {t} {gc}",
                          f"add rule {t} {gc} ip saddr @{gm} return",
                          f"add rule {t} {gc} drop"]
            lines.append(f"add element {t} {gm} {{ {net.address} }}")
            if net.gang_port:
                lines.append(f"add element {t} gang_guard {{ {net.address} . {net.gang_port} : jump {gc} }}")
        if net.serve_port:
            lines.append(f"add element {t} serve_ports {{ {net.address} . {net.serve_port} }}")
        return "\n".join(lines) + "\n"

    def _serve_rules(self, net: PodNet) -> str:
        """A replica's port at the node's own address, from the server's addresses only."""
        t, port = f"inet {TABLE}", net.serve_port
        sources = ", ".join(f"{a} . {port}" for a in net.servers)
        return (f"add element {t} serve_from {{ {sources} }}\n"
                f"add element {t} serve_dnat {{ {port} : {net.address} }}\n")

    def _remove_rules(self, net: PodNet) -> None:
        lines = self._rule_removals(net)
        if _run(["nft", "-f", "-"], "\n".join(lines) + "\n").returncode != 0:
            for line in lines:  # some were gone already (a half-made attachment): each on its own
                _run(["nft", "-f", "-"], line + "\n")

    def _rule_removals(self, net: PodNet) -> list[str]:
        t = f"inet {TABLE}"
        lines = [f"delete element {t} src_tenant {{ {net.address} }}",
                 f'delete element {t} pod_ifs {{ "{net.veth}" . {net.address} }}',
                 f"delete element {t} pods {{ {net.address} }}",
                 f"delete element {t} ta_{net.tenant_key} {{ {net.address} }}"]
        if net.gang_key:
            if net.gang_port:
                lines.append(f"delete element {t} gang_guard {{ {net.address} . {net.gang_port} }}")
            lines.append(f"delete element {t} gm_{net.gang_key} {{ {net.address} }}")
        if net.serve_port:
            lines.append(f"delete element {t} serve_ports {{ {net.address} . {net.serve_port} }}")
        if net.servers:
            sources = ", ".join(f"{a} . {net.serve_port}" for a in net.servers)
            lines += [f"delete element {t} serve_dnat {{ {net.serve_port} }}",
                      f"delete element {t} serve_from {{ {sources} }}"]
        return lines

    def _remove_links(self, net: PodNet | _Spare) -> None:
        if Path(f"/sys/class/net/{net.veth}").exists():
            _run(["ip", "link", "del", net.veth])
        if (NETNS_DIR / net.netns).exists():
            _run(["ip", "netns", "del", net.netns])

    def detach(self, pod_id: str) -> None:
        """Have the pod's namespace, veth and rules removed (its processes have ended), by a
        thread of this network, so the caller (the agent's poll, the control loop's path) never
        waits for it: the ends of many pods go in one batch. Until then its address stays taken.
        Idempotent."""
        with self._lock:
            net = self._live.pop(pod_id, None)
            if net is None:
                return
            if net.gang_key or net.serve_port or self.kept_limit <= 0 or self._stopping:
                self._pending[pod_id] = net
            else:  # kept for the tenant's next pod, if the worker finds it empty
                self._to_keep[pod_id] = net
            self._wake_worker()

    def _work(self) -> None:
        """The worker: tear down the pods that ended (in batches), then keep `spares` namespaces
        made ahead (addressed and routed, without rules: nothing runs in them), so a launch only
        adds its rules. At close it finishes the teardowns, removes the spares and ends."""
        while True:
            spare = None
            with self._lock:
                while (not self._pending and not self._to_keep and not self._stopping
                       and len(self._spares) >= self.spares):
                    self._changed.wait()
                if self._to_keep:
                    candidates = dict(self._to_keep)  # still listed: a launch of the tenant waits on them
                    self._lock.release()
                    try:  # outside the lock: it reads /proc
                        busy = _netns_in_use([net.netns for net in candidates.values()])
                    finally:
                        self._lock.acquire()
                    for pod_id, net in candidates.items():
                        del self._to_keep[pod_id]
                        if net.netns in busy or self._stopping:
                            self._pending[pod_id] = net  # something of the pod lives on in it: it goes
                        else:
                            self._kept[pod_id] = net
                    while len(self._kept) > self.kept_limit:  # the oldest go first
                        oldest = next(iter(self._kept))
                        self._pending[oldest] = self._kept.pop(oldest)
                    self._changed.notify_all()
                if self._stopping:  # kept namespaces go with the agent
                    self._pending.update(self._kept)
                    self._kept.clear()
                batch = list(self._pending.values())
                leftover: list[_Spare] = []
                if not batch and self._stopping:
                    leftover, self._spares = self._spares, []
                elif not batch and len(self._spares) >= self.spares:
                    continue
                elif not batch:
                    spare = _Spare(*self._names(), self._address_for(0))
                    self._making.add(spare.address)
            if not batch and spare is None:  # stopping, nothing left to tear down
                with self._host_lock():
                    self._tear_down([], leftover)
                    with self._lock:
                        tenants = set(self._tenants)
                    self._drop_unused_chains(tenants=tenants)
                return
            try:
                if batch:
                    with self._host_lock():
                        self._tear_down(batch)
                    if self.announce is not None and self._routes:
                        self.announce([], [net.address for net in batch])
                elif spare is not None:
                    self._create(spare)
            except Exception:  # the next start's sweep removes what this left
                log.exception("the pod network's worker failed (%d pod(s) to tear down)", len(batch))
                if spare is not None:
                    self._remove_links(spare)
                    spare = None
            with self._lock:
                for net in batch:
                    self._pending.pop(net.pod_id, None)
                if spare is not None:
                    self._making.discard(spare.address)
                    self._spares.append(spare)  # at close, removed with the others
                self._changed.notify_all()

    def _tear_down(self, batch: Sequence[PodNet], spares: Sequence[_Spare] = ()) -> None:
        """Two programs for the whole batch: `ip` (veths, namespaces) and `nft` (their elements)."""
        nets: list[PodNet | _Spare] = [*batch, *spares]
        links = [f"link del {n.veth}" for n in nets if Path(f"/sys/class/net/{n.veth}").exists()]
        links += [f"netns del {n.netns}" for n in nets if (NETNS_DIR / n.netns).exists()]
        if links:
            _run(["ip", "-force", "-batch", "-"], "\n".join(links) + "\n")
        if not batch:
            return
        lines = [line for net in batch for line in self._rule_removals(net)]
        if _run(["nft", "-f", "-"], "\n".join(lines) + "\n").returncode != 0:
            for net in batch:  # some were gone already (a half-made attachment): each on its own
                self._remove_rules(net)
        forget_connections(n.address for n in batch)
        self._drop_unused_chains(gangs={n.gang_key for n in batch if n.gang_key})

    def _drop_unused_chains(self, *, gangs: Iterable[str] = (), tenants: Iterable[str] = ()) -> None:
        """Delete the chains (and then sets) of these gangs and tenants that nothing refers to any
        more: a tenant's chain is referred to by each of its live pods' elements on this machine, a
        gang's by its rank 0's guard, so the delete fails (and changes nothing) while one lives. A
        gang's go with its pods (there is one a gang); a tenant's, of which there are few, stay
        until the agent stops, so its next pod here only adds elements."""
        kinds = (("g_", "gm_", self._gangs, set(gangs)), ("t_", "ta_", self._tenants, set(tenants)))
        for chain, members, made, keys in kinds:
            for key in sorted(keys):
                if _run(["nft", "delete", "chain", "inet", TABLE, chain + key]).returncode == 0:
                    _run(["nft", "delete", "set", "inet", TABLE, members + key])
                    with self._lock:
                        made.discard(key)

    # ---- other machines ----------------------------------------------------------------------
    def routes(self, peers: Iterable[tuple[str, int, str]]) -> dict[str, str]:
        """The routes this machine needs to the other machines' blocks: `peers` are (node, slot,
        node address) of every machine of the pool; a block on this machine itself (another agent
        on this host, as simulated nodes are) needs none, its pods' routes are here already."""
        wanted: dict[str, str] = {}
        for _node, slot, address in peers:
            if slot == self.slot or not address or _is_local(address):
                continue
            wanted[str(node_subnet(self.settings.pod_network, slot))] = address
        return wanted

    def set_routes(self, peers: Iterable[tuple[str, int, str]]) -> None:
        """Route the other machines' blocks through their node addresses (one `ip -batch`); the
        pods of a machine no longer among `peers` are forgotten here."""
        if not self.active or self._claim < 0:
            return
        wanted = self.routes(peers)
        with self._lock:
            old, self._routes = self._routes, wanted
            blocks = [ipaddress.IPv4Network(cidr) for cidr in wanted]
            gone = [a for a in self._remote if not any(ipaddress.IPv4Address(a) in b for b in blocks)]
        lines = [f"route replace {cidr} via {via}" for cidr, via in wanted.items() if old.get(cidr) != via]
        lines += [f"route del {cidr}" for cidr in old if cidr not in wanted]
        if lines:
            _run(["ip", "-force", "-batch", "-"], "\n".join(lines) + "\n")
        if gone:
            self.forget_remote(gone)
        self._guard_peers()

    def members(self) -> list[Member]:
        """This machine's pods (and kept namespaces) as the other machines' tables know them."""
        with self._lock:
            nets = (*self._live.values(), *self._kept.values(), *self._to_keep.values())
            return [net.member() for net in nets]

    def remote_members(self) -> list[Member]:
        with self._lock:
            return list(self._remote.values())

    def add_remote(self, members: Sequence[Member]) -> None:
        """Pods of other machines (told by their agents, before they start): this machine's pods of
        the same tenant (and gang) reach them and are reached by them. One nft transaction."""
        if not self.active or not members:
            return
        t = f"inet {TABLE}"
        lines: list[str] = []
        for m in members:
            tc, ta = f"t_{m.tenant_key}", f"ta_{m.tenant_key}"
            lines += [f"add set {t} {ta} {{ type ipv4_addr; }}", f"add chain {t} {tc}",
                      f"flush chain {t} {tc}", f"add rule {t} {tc} ip daddr @{ta} accept",
                      f"add element {t} {ta} {{ {m.address} }}", f"add element {t} remote {{ {m.address} }}",
                      f"add element {t} src_tenant {{ {m.address} : jump {tc} }}"]
            if m.gang_key:
                gc, gm = f"g_{m.gang_key}", f"gm_{m.gang_key}"
                lines += [f"add set {t} {gm} {{ type ipv4_addr; }}", f"add chain {t} {gc}",
                          f"flush chain {t} {gc}", f"add rule {t} {gc} ip saddr @{gm} return",
                          f"add rule {t} {gc} drop", f"add element {t} {gm} {{ {m.address} }}"]
        with self._lock:
            stale = [self._remote[m.address] for m in members
                     if m.address in self._remote and self._remote[m.address] != m]
        if stale:  # an address taken over by another pod there: its old tenant and gang go first
            self.forget_remote([m.address for m in stale])
        _must(["nft", "-f", "-"], "\n".join(lines) + "\n")
        with self._lock:
            for m in members:
                self._remote[m.address] = m
                self._tenants.add(m.tenant_key)
                if m.gang_key:
                    self._gangs.add(m.gang_key)

    def told(self, origin: str, incarnation: str, seq: int, added: Sequence[Member],
             removed: Sequence[str], *, block: str = "") -> None:
        """What the agent of another machine (node `origin`, this run of it: `incarnation`) said in
        its word number `seq`: pods attached (`added`) and addresses given up (`removed`), applied
        in the order it said them, whatever order they arrive in (a word on an address older than
        the last one applied is dropped). With `block` (that machine's block), `added` is the whole
        of its pods at that word: the other pods of the block this table holds are forgotten (what
        a restarted agent, or the table of a machine whose agent restarted, missed meanwhile)."""
        if not self.active:
            return
        subnet = ipaddress.IPv4Network(block) if block else None
        if subnet is not None and (not subnet.subnet_of(self.settings.pod_network)
                                   or subnet.overlaps(self.subnet)):
            raise InvalidInput(f"Block {block} is not another machine's block of the pod network "
                               f"{self.settings.pod_network}.")
        with self._told_lock:
            if incarnation in self._retired:
                return  # a late word of an agent that was followed by another
            last, seen = self._told.get(origin, ("", {}))
            if last != incarnation:
                if last:
                    if len(self._retired) >= 10_000:
                        self._retired.clear()
                    self._retired.add(last)
                seen = {}
                self._told[origin] = (incarnation, seen)
            fresh = [m for m in added if seen.get(m.address, -1) < seq]
            gone = [a for a in removed if seen.get(a, -1) < seq]
            if subnet is not None:
                listed = {m.address for m in added}
                with self._lock:
                    held = [a for a in self._remote if ipaddress.IPv4Address(a) in subnet]
                gone += [a for a in held if a not in listed and seen.get(a, -1) < seq]
            for address in (*(m.address for m in fresh), *gone):
                seen[address] = seq
            self.forget_remote(gone)
            self.add_remote(fresh)

    def forget_remote(self, addresses: Sequence[str]) -> None:
        """Pods of other machines that ended there (or whose machine left): no longer reached."""
        with self._lock:
            members = [self._remote.pop(a) for a in addresses if a in self._remote]
        if not members or not self.active:
            return
        t = f"inet {TABLE}"
        lines = []
        for m in members:
            lines += [f"delete element {t} src_tenant {{ {m.address} }}",
                      f"delete element {t} remote {{ {m.address} }}",
                      f"delete element {t} ta_{m.tenant_key} {{ {m.address} }}"]
            if m.gang_key:
                lines.append(f"delete element {t} gm_{m.gang_key} {{ {m.address} }}")
        if _run(["nft", "-f", "-"], "\n".join(lines) + "\n").returncode != 0:
            for line in lines:  # some were gone already: each on its own
                _run(["nft", "-f", "-"], line + "\n")
        self._drop_unused_chains(gangs={m.gang_key for m in members if m.gang_key})

    def pod_url(self, url: str) -> str:
        """`url` (the pool's GPUPOOL_URL) as a pod in a namespace reaches it: a loopback host of a
        published service becomes the node's gateway, which DNAT takes back to loopback; '' when
        it needs no change."""
        try:
            parts = urllib.parse.urlsplit(url)
            host, port = parts.hostname or "", parts.port
        except ValueError:
            return ""
        if not host or port is None or port not in self._published_local():
            return ""
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return ""
        except ValueError:
            if host != "localhost":
                return ""
        return parts._replace(netloc=f"{self.gateway}:{port}").geturl()

    def attached(self) -> list[str]:
        with self._lock:
            return list(self._live)

    def kept(self) -> list[PodNet]:
        """The namespaces kept for their tenants' next pods (each as the pod that last held it)."""
        with self._lock:
            return list(self._kept.values())

    # ---- leftovers -------------------------------------------------------------------------
    def _sweep(self) -> None:
        """Remove this slot's namespaces, veths and elements that no live pod holds, then the
        tenant and gang chains no pod uses any more (under the host lock)."""
        live = {net.netns for net in self._live.values()}
        live_veths = {net.veth for net in self._live.values()}
        live_addresses = {net.address for net in self._live.values()}
        prefix = f"gpn-{self.key}-"
        if NETNS_DIR.is_dir():
            for entry in NETNS_DIR.iterdir():
                if entry.name.startswith(prefix) and entry.name not in live:
                    _run(["ip", "netns", "del", entry.name])
        for entry in Path("/sys/class/net").iterdir():
            if entry.name.startswith(f"gv{self.key}") and entry.name not in live_veths:
                _run(["ip", "link", "del", entry.name])
        done = _run(["nft", "-j", "list", "table", "inet", TABLE])
        if done.returncode != 0:
            return
        lines: list[str] = []
        empty: list[str] = []
        t = f"inet {TABLE}"
        items = json.loads(done.stdout).get("nftables", [])
        dead_ports = {_element_key(e) for item in items if (item.get("map") or {}).get("name") == "serve_dnat"
                      for e in item["map"].get("elem", [])
                      if isinstance(e, list) and self._ours_dead(_first_address(e[1]), live_addresses)}
        for item in items:
            body = item.get("set") or item.get("map")
            if body is None:
                continue
            name = body["name"]
            if name == POD_CONNS:  # the kernel's own entries, gone with their connections
                continue
            elements = body.get("elem", [])
            if name == "serve_dnat":  # port -> a replica's address: the address decides
                gone = [e for e in elements if _element_key(e) in dead_ports]
            elif name == "serve_from":  # server . port: gone with its port's replica
                gone = [e for e in elements if _element_key(e).rsplit(" . ", 1)[-1] in dead_ports]
            else:
                gone = [e for e in elements if self._ours_dead(_first_address(e), live_addresses)]
            for element in gone:
                lines.append(f"delete element {t} {name} {{ {_element_key(element)} }}")
            if name.startswith(("ta_", "gm_")) and len(gone) == len(elements):
                empty.append(name)
        if lines:
            _must(["nft", "-f", "-"], "\n".join(lines) + "\n")
        self._adopt_remote(json.loads(done.stdout).get("nftables", []))
        for name in empty:  # another slot may still use it: then the chain's delete fails, and it stays
            chain = ("t_" if name.startswith("ta_") else "g_") + name.split("_", 1)[1]
            if _run(["nft", "delete", "chain", "inet", TABLE, chain]).returncode == 0:
                _run(["nft", "delete", "set", "inet", TABLE, name])

    def _adopt_remote(self, items: Sequence[dict[str, object]]) -> None:
        """The other machines' pods an earlier agent of this machine put in the table (a restarted
        agent): known again, so their ends and a whole set told by their machine (`told`) remove
        them, and an address taken over there replaces its old tenant."""
        remote: set[str] = set()
        owners: dict[str, dict[str, str]] = {"ta_": {}, "gm_": {}}
        for item in items:
            body = item.get("set")
            if not isinstance(body, dict):
                continue
            name = str(body.get("name", ""))
            addresses = [_first_address(e) for e in body.get("elem", [])]
            if name == "remote":
                remote.update(a for a in addresses if a)
            elif name[:3] in owners:
                owners[name[:3]].update((a, name[3:]) for a in addresses if a)
        adopted = {}
        for address in remote:
            try:
                ip = ipaddress.IPv4Address(address)
            except ValueError:
                continue
            tenant = owners["ta_"].get(address)
            if tenant and ip in self.settings.pod_network and ip not in self.subnet:
                adopted[address] = Member(address, tenant, owners["gm_"].get(address, ""))
        with self._lock:
            for address, member in adopted.items():
                self._remote.setdefault(address, member)

    def _ours_dead(self, address: str, live: set[str]) -> bool:
        if not address:
            return False
        try:
            return ipaddress.IPv4Address(address) in self.subnet and address not in live
        except ValueError:
            return False

    def close(self) -> None:
        """Finish the teardowns asked for, and forget the live pods (their attachments stay, for
        the next agent to keep). Idempotent."""
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
            worker = self._worker
        if worker is not None:
            worker.join(timeout=2 * _TIMEOUT_S)
        with self._lock:
            self._live.clear()
            claim, self._claim = self._claim, -1
        if claim >= 0:
            os.close(claim)


def _is_local(address: str) -> bool:
    """Whether `address` is one of this machine's own (a loopback one, or one a socket can bind)."""
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        return False
    if ip.is_loopback:
        return True
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe_socket:
        try:
            probe_socket.bind((address, 0))
        except OSError:
            return False
    return True


SETTLE_S = 1.0
"""A process's network namespace is read from /proc until it has lived this long, then once more
and no more (see _netns_in_use)."""
_seen_lock = threading.Lock()
_seen: dict[tuple[str, int], tuple[str, float, bool]] = {}
"""(pid, its /proc entry's inode) -> (its `ns/net` link, when first seen, whether settled)."""


def _netns_in_use(names: Sequence[str]) -> set[str]:
    """Those of the namespaces /run/netns/NAME that a process is in (its /proc/PID/ns/net names the
    same namespace); a namespace that cannot be read counts as in use.

    A scan reads only the processes it has not settled: an unprivileged process can leave its
    network namespace (for a new one) but never enter an existing one (setns needs CAP_SYS_ADMIN
    over it), and root processes that enter one (the launcher's helper, `ip netns exec`) do so just
    after they start; so a process is read at each scan until it has lived SETTLE_S, once more after
    that, and then known by its pid and its /proc entry's inode (a pid used again is a new entry).
    On a machine of a few hundred processes that is a directory listing and a few links a scan,
    instead of a link for every process (about 3 ms of CPU each time a pod ended)."""
    targets: dict[str, str] = {}
    busy: set[str] = set()
    for name in names:
        try:
            st = os.stat(NETNS_DIR / name)
        except OSError:
            busy.add(name)
            continue
        targets[f"net:[{st.st_ino}]"] = name
    if not targets:
        return busy
    now = time.monotonic()
    with _seen_lock:
        seen: dict[tuple[str, int], tuple[str, float, bool]] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            key = (entry.name, entry.inode())
            known = _seen.get(key)
            if known is not None and known[2]:
                link = known[0]
                seen[key] = known
            else:
                try:
                    link = os.readlink(f"/proc/{entry.name}/ns/net")
                except OSError:  # it ended meanwhile, or may not be read (nor then enter ours)
                    link = ""
                first = now if known is None else known[1]
                seen[key] = (link, first, now - first >= SETTLE_S)
            held = targets.get(link)
            if held is not None:
                busy.add(held)
        _seen.clear()
        _seen.update(seen)
    return busy


def _first_address(element: object) -> str:
    """The IPv4 address an element of the table's sets and maps starts with ('' if none)."""
    if isinstance(element, str):
        return element
    if isinstance(element, dict):
        if "elem" in element:
            return _first_address(element["elem"]["val"])
        if "concat" in element:
            for part in element["concat"]:
                if isinstance(part, str) and part.count(".") == 3:
                    return part
            return ""
    if isinstance(element, list) and element:  # a map element: [key, value]
        return _first_address(element[0])
    return ""


def _element_key(element: object) -> str:
    """The key of an element as `nft` writes it in a delete."""
    if isinstance(element, list):
        element = element[0]
    if isinstance(element, dict) and "elem" in element:
        element = element["elem"]["val"]
    if isinstance(element, dict) and "concat" in element:
        return " . ".join(f'"{p}"' if isinstance(p, str) and not p[:1].isdigit() else str(p)
                          for p in element["concat"])
    return str(element)


def _router_uids() -> str:
    """The uids that may open a replica's serve port: the pool's, and its router's account (where
    the pool runs as root HAProxy's workers run as it; created here if missing, so the rule holds it
    whichever starts first)."""
    uids = {os.geteuid()}
    try:
        uids.add(ensure_router_account().uid)
    except ProviderError as exc:
        log.warning("services' replicas in pod namespaces are reachable by the pool's account only: %s",
                    exc.message)
    return ", ".join(map(str, sorted(uids)))
