"""The node agent: this machine's devices (NVML or simulated), their health, and the pods it runs.

The local provider uses one NodeAgent in-process; a scale-out provider would run one per node.
A pod starts from an empty environment (identity.base_env, then the pool's variables and the user's
--env), in a private directory of its own, and, when the agent runs as root, as its tenant's Unix
account (identity.py): never with the agent's identity, secrets or environment. Its workload's
checkpoint directory (checkpoints.py) is kept across the workload's attempts on this node.
Faults can be injected only into simulated devices.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from gpupool.agent import container, mounts, workdir
from gpupool.agent.checkpoints import CHECKPOINT_DIR_ENV, CheckpointDirs
from gpupool.agent.diskguard import DiskGuard, parse_reserve
from gpupool.agent.execs import IN_IMAGE, ExecContext, Execs
from gpupool.agent.identity import (
    BASE_PATH,
    ON_BEHALF_SUFFIX,
    Identities,
    PodIdentity,
    base_env,
    make_private_dir,
    open_owned_dir,
    prepare_scratch_root,
    write_owned_file,
)
from gpupool.agent.isolation import (
    SITECUSTOMIZE_DIR,
    IsolationPlan,
    Layer,
    LayerState,
    find_cgroup_root,
    plan_isolation,
    prepare_cgroup,
    process_limit,
)
from gpupool.agent.leftovers import pod_mark
from gpupool.agent.mps import MpsDaemon
from gpupool.agent.netns import Announce, NetnsMode, NetworkSettings, PodNet, PodNetwork
from gpupool.agent.podstate import PodRecord, load_record, process_alive, write_atomic
from gpupool.agent.probes.infiniband import SYSFS_ROOT, read_ib_ports
from gpupool.agent.probes.nvml import NvmlProbe, ProbeResult, ProbeStatus
from gpupool.agent.runner import DEFAULT_MAX_LOG_BYTES, LogStream, Runner
from gpupool.core.model import MAX_SIMULATED_NODE_DEVICES, Device, IbPort, Node
from gpupool.errors import InvalidInput, NotFound, ProviderError
from gpupool.pods import HealthEvent, LogChunk, PodLaunch, secret_injection
from gpupool.profiles import ProfileSet, default_profiles
from gpupool.providers.nodespec import SIMULATED_LABEL, simulated_devices

log = logging.getLogger("gpupool.agent")
SCRATCH_DIR_ENV = "GPUPOOL_SCRATCH_DIR"
POD_ADDRESS_ENV = "GPUPOOL_POD_ADDRESS"
"""The pod's own address in its network namespace (set only when it has one)."""
POD_PATH_ENV = "GPUPOOL_POD_PATH"
SHARED_SCRATCH_ROOT = Path("/var/tmp/gpupool-pods")
"""Where pods' private directories go when pods run as other accounts (the agent's own state
directory is closed to them); GPUPOOL_SCRATCH_DIR chooses another."""
NET_FILE = "net.json"
"""Where an earlier agent kept a pod's network attachment (now in its record: PodRecord.net)."""
SITE_DIR = ".gpupool-site"
"""The copy of the pool's sitecustomize in an image pod's private directory (`_site_copy`)."""
LENT_GRACE_S = 60.0
"""How long a namespace lent to another process's pod (NodeAgent.lend) stays without the pod's record
(the borrower died before starting it, or gave up waiting for the answer) before it goes."""
SIMULATE_SYNTAX = "write DEVICESxMODEL[,...] for this machine, for example '4xH100' or '2xA100,2xT4'"
_GROUP = re.compile(r"^\s*(\d+)\s*[xX]\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*$")


def simulated_local_devices(spec: str, node_name: str, profiles: ProfileSet) -> tuple[Device, ...]:
    """Devices for this machine from "DEVICESxMODEL[,...]", indexed in order, marked simulated; at most
    MAX_SIMULATED_NODE_DEVICES in all (refused before any is built)."""
    groups: list[tuple[int, str]] = []
    for group in spec.split(","):
        match = _GROUP.match(group)
        if match is None:
            raise InvalidInput(f"Cannot read simulated devices {group.strip()!r}; {SIMULATE_SYNTAX}.")
        groups.append((int(match.group(1)), match.group(2)))
    total = sum(count for count, _ in groups)
    if total > MAX_SIMULATED_NODE_DEVICES:
        raise InvalidInput(f"The simulated devices {spec.strip()!r} are {total} in all, but a simulated node "
                           f"holds at most {MAX_SIMULATED_NODE_DEVICES} (more than any real server); give "
                           "fewer.")
    devices: list[Device] = []
    for count, model in groups:
        profile = profiles.get_profile(model)
        upto = len(devices) + count
        devices.extend(simulated_devices(node_name, profile, upto)[len(devices) :])
    return tuple(devices)


def host_memory_mib() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def host_cpu_milli() -> int:
    try:
        return len(os.sched_getaffinity(0)) * 1000
    except (AttributeError, OSError):
        return (os.cpu_count() or 1) * 1000


class NetworkLender(Protocol):
    """Another process's pod network that this agent's pods take their namespaces from (a Ray pod
    actor's: its node's agent, which holds the node's block, rules and announcements)."""

    def lend(self, pod: PodLaunch, url: str) -> tuple[PodNet | None, str, str]:
        """NodeAgent.lend: the pod's attachment (None: it shares the node's network), GPUPOOL_URL as
        the pod reaches it ('' when unchanged), and what the pod's network layer is."""

    def give_back(self, pod_id: str) -> None:
        """The pod has ended (or was never started): its namespace may go."""


class NodeAgent:
    """Discovers devices, tracks their health and runs pods inside their slices on this machine."""

    def __init__(self, state_dir: Path | str, *, node_name: str | None = None, simulate: str | None = None,
                 fallback_simulate: str | None = None, profiles: ProfileSet | None = None,
                 probe: NvmlProbe | None = None, mps: MpsDaemon | None = None,
                 cgroup_root: Path | str | None = None, clock: Callable[[], float] = time.time,
                 ib_sysfs_root: Path | str = SYSFS_ROOT, identities: Identities | None = None,
                 scratch_root: Path | str | None = None, pod_path: str | None = None,
                 max_log_bytes: int = DEFAULT_MAX_LOG_BYTES, network: NetworkSettings | None = None,
                 network_slot: int = 0, published: Sequence[tuple[str, int]] = (),
                 guarded: Sequence[Path] = ()) -> None:
        self.ib_sysfs_root = Path(ib_sysfs_root)
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.state_dir, 0o700)
        self.identities = identities or Identities()
        self.scratch_root = prepare_scratch_root(Path(scratch_root or self._default_scratch_root()))
        self.checkpoints = CheckpointDirs(self.scratch_root)
        self.pod_path = pod_path or os.environ.get(POD_PATH_ENV) or BASE_PATH
        self.node_name = node_name or socket.gethostname()
        self._profiles = profiles or default_profiles()
        self._clock = clock
        self._probe = probe or NvmlProbe(profiles=self._profiles)
        self._mps = mps or MpsDaemon(self.state_dir)
        self.cgroup_root = find_cgroup_root(cgroup_root)
        self.pod_processes = process_limit()
        """RLIMIT_NPROC of every pod account here (isolation.process_limit)."""
        self.runner = Runner(self.state_dir, clock=clock, max_log_bytes=max_log_bytes)
        self.execs = Execs(self.runner.launcher, self.runner.mark)
        reserve = parse_reserve()  # GPUPOOL_DISK_RESERVE: a value it cannot use stops the agent's start
        self.disk_guard: DiskGuard | None = None
        """Ends the pods of the account that filled this node's disk (diskguard.py): only where pods
        run as accounts of their own, whose files it can tell apart."""
        if self.identities.switch_users and not reserve.off:
            runner = self.runner
            self.disk_guard = DiskGuard(
                (self.state_dir, self.scratch_root, *map(Path, guarded)), scratch_root=self.scratch_root,
                pool_id=self.identities.pool_id, reserve=reserve,
                live_pods=lambda: [(r.pod_id, r.uid) for r in runner.poll() if not r.finished],
                fail=runner.fail, drive=runner.poll, when_idle=runner.when_idle, node=self.node_name)
        """Commands run inside live pods (gpupool exec; execs.py)."""
        self.containers, self.containers_unavailable = container.detect()
        """What runs `--image` pods here (container.py), or None and the sentence why nothing does."""
        self.lender: NetworkLender | None = None
        """Where this agent's pods take their namespaces from instead of `network` (a Ray pod actor's)."""
        self._borrowed: set[str] = set()
        self._lent: dict[str, tuple[Path, float]] = {}
        """Pods another process starts in namespaces of `network` (`lend`) -> their record file and
        when lent: a namespace lives while its pod's record says the pod runs."""
        self.network = PodNetwork(network or NetworkSettings(mode=NetnsMode.OFF), network_slot, published)
        """Each pod's network namespace (netns.py); off unless `network` asks for it."""
        if network is None:
            self.network.unavailable = "this provider does not give pods network namespaces"
        elif self.network.active and not self.identities.switch_users:  # only the helper can join one
            self.network.unavailable = ("pods run as the agent's own user (no tenant accounts), so they "
                                        "share the node's network")
        self.network.start(self._attached_pods())
        log.info("node %s: pod network: %s", self.node_name, self.network.detail)
        self._lock = threading.RLock()
        self._faults: dict[str, str] = {}
        self._events: list[HealthEvent] = []
        self._cpu_milli, self._memory_mib = host_cpu_milli(), host_memory_mib()
        self.probe_result: ProbeResult = ProbeResult(ProbeStatus.OK, "devices are simulated")
        if simulate:
            self._simulated: tuple[Device, ...] | None = simulated_local_devices(
                simulate, self.node_name, self._profiles)
        else:
            self._simulated = None
            self.probe_result = self._probe.probe()
            if self.probe_result.status is not ProbeStatus.OK and fallback_simulate:
                self._simulated = simulated_local_devices(fallback_simulate, self.node_name, self._profiles)

    def use_network(self, settings: NetworkSettings, slot: int, published: Sequence[tuple[str, int]],
                    peers: Sequence[tuple[str, int, str]] = (), announce: Announce | None = None,
                    servers: Sequence[str] = ()) -> None:
        """Give pods network namespaces in block `slot` of the pod network from now on (a Ray
        machine's block, handed out by the server when it joined), with routes to the other
        machines' blocks (`peers`: node, slot, node address); `announce` tells the other machines of
        this one's pods (netns.Announce); `servers`, the server's addresses, from which a service
        replica here is reached at the node's address (PodNetwork.set_servers). Idempotent; the
        block of a machine with pods in namespaces is not changed under them (it keeps the one it
        has)."""
        with self._lock:
            current = self.network
            if current.settings != settings or current.slot != slot:
                if current.attached():
                    log.warning("node %s: pods are attached to block %d; block %d not taken",
                                self.node_name, current.slot, slot)
                else:
                    current.close()
                    network = PodNetwork(settings, slot, published)
                    if network.active and not self.identities.switch_users:
                        network.unavailable = ("pods run as the agent's own user (no tenant accounts), so "
                                               "they share the node's network")
                    network.start(self._attached_pods())
                    self.network = current = network
                    log.info("node %s: pod network: %s", self.node_name, network.detail)
            elif tuple(published) != current.published:
                current.publish(published)
            current.announce = announce
            current.set_servers(servers)
            current.set_routes(peers)

    def _attached_pods(self) -> dict[str, PodNet]:
        """The network attachments of the pods still running here (re-adopted after a restart)."""
        live = {}
        for record in self.runner.poll():
            if record.finished:
                continue
            text = record.net
            if not text:  # a pod started by an agent that kept it in a file of its own
                with contextlib.suppress(OSError):
                    text = (self.runner.pod_dir(record.pod_id) / NET_FILE).read_text()
            net = PodNet.from_json(text) if text else None
            if net is not None and net.pod_id == record.pod_id:
                live[record.pod_id] = net
        for pod_id, (path, _at) in self._lent.items():
            lent = load_record(path)
            net = PodNet.from_json(lent.net) if isinstance(lent, PodRecord) and _runs(lent) else None
            if net is not None and net.pod_id == pod_id:
                live[pod_id] = net
        return live

    # ---- namespaces lent to another process's pods (a Ray pod actor's, NetworkLender) -------
    def adopt_lent(self, records: Mapping[str, Path]) -> None:
        """Pods an earlier agent lent namespaces to (pod id -> its record file): before this
        agent's first `use_network`, so that network's start keeps the namespaces of those that run."""
        now = time.monotonic()
        with self._lock:
            self._lent.update((pod_id, (path, now)) for pod_id, path in records.items())

    def lend(self, pod: PodLaunch, record: Path, url: str) -> tuple[PodNet | None, str, str]:
        """A namespace of this node's pod network for a pod another process starts as its tenant's
        account (NetworkLender.lend); `record`, the file where that process keeps the pod's record:
        the namespace goes once the record says the pod ended, or `give_back`."""
        self.end_lent()
        net, layer, pod_url = self._attach(pod, True, url)
        if net is not None:
            with self._lock:
                self._lent[pod.pod_id] = (record, time.monotonic())
        return net, pod_url, layer.detail

    def take_back(self, pod_id: str) -> None:
        """The borrower says the pod ended or never started (idempotent)."""
        with self._lock:
            known = self._lent.pop(pod_id, None)
        if known is not None:
            self.network.detach(pod_id)

    def end_lent(self) -> None:
        """Tear down the lent namespaces whose pods ended (their records say so, or their process is
        gone), and those whose record never came within LENT_GRACE_S."""
        now = time.monotonic()
        with self._lock:
            lent = dict(self._lent)
        for pod_id, (path, at) in lent.items():
            record = load_record(path)
            if (not _runs(record)) if isinstance(record, PodRecord) else now - at >= LENT_GRACE_S:
                self.take_back(pod_id)

    def _default_scratch_root(self) -> Path:
        explicit = os.environ.get(SCRATCH_DIR_ENV)
        if explicit:
            return Path(explicit)
        return SHARED_SCRATCH_ROOT if self.identities.switch_users else self.state_dir / "scratch"

    @property
    def simulated(self) -> bool:
        return self._simulated is not None

    @property
    def mps_available(self) -> bool:
        return self._mps.available

    @property
    def device_status(self) -> str:
        """One line about device discovery (e.g. why there are no NVIDIA devices)."""
        if self._simulated is not None:
            return f"{len(self._simulated)} simulated device(s); {self.probe_result.message}"
        return self.probe_result.message

    def _devices(self) -> tuple[Device, ...]:
        if self._simulated is not None:
            return self._simulated
        for event in self._probe.poll_xid_events():
            if event.critical:
                self._record(event.device_uuid, False, f"NVML XID {event.xid}")
        self.probe_result = self._probe.probe()
        return tuple(d.to_device() for d in self.probe_result.devices)

    def ib_ports(self) -> tuple[IbPort, ...]:
        """This machine's InfiniBand ports from sysfs; () when there is no IB stack."""
        return tuple(
            IbPort(hca=p.hca, port=p.port, lid=p.lid or 0,
                   guid=f"0x{p.node_guid:016x}" if p.node_guid is not None else "",
                   rate_gbps=p.rate_gbps or 0.0, state=p.state)
            for p in read_ib_ports(self.ib_sysfs_root, self._clock)
        )

    def node(self) -> Node:
        """This machine as a Node, with injected faults and XID health applied."""
        with self._lock:
            devices = tuple(
                replace(d, healthy=d.healthy and d.uuid not in self._faults) for d in self._devices()
            )
            labels = {SIMULATED_LABEL: "true"} if self.simulated else {}
            if self.containers is not None:
                labels[container.CONTAINERS_LABEL] = self.containers.label
            return Node(name=self.node_name, cpu_milli=self._cpu_milli, memory_mib=self._memory_mib,
                        devices=devices, labels=labels, ib_ports=self.ib_ports(),
                        healthy="" not in self._faults)

    # ---- health ----------------------------------------------------------------------------
    def _record(self, device_uuid: str, healthy: bool, reason: str) -> None:
        self._events.append(HealthEvent(self._clock(), self.node_name, device_uuid, healthy, reason))

    def _check_fault_target(self, device_uuid: str) -> None:
        """NotFound for an unknown uuid; ProviderError for a real device or node (a fault on real
        hardware is the hardware's to report, through NVML)."""
        if device_uuid and device_uuid not in {d.uuid for d in self._devices()}:
            raise NotFound(f"Node {self.node_name!r} has no device {device_uuid!r}.")
        if self._simulated is None:
            what = f"Device {device_uuid!r} of node {self.node_name!r} is a real device" if device_uuid \
                else f"Node {self.node_name!r} is a real node"
            raise ProviderError(f"{what}; faults can be injected only into simulated devices and nodes "
                                "(gpupool up --simulate).")

    def inject_fault(self, device_uuid: str = "", reason: str = "injected fault") -> None:
        """Mark a simulated device (or with no uuid the node) unhealthy. Idempotent. NotFound for an
        unknown uuid, ProviderError for a real device or node."""
        with self._lock:
            self._check_fault_target(device_uuid)
            if device_uuid not in self._faults:
                self._faults[device_uuid] = reason
                self._record(device_uuid, False, reason)

    def clear_fault(self, device_uuid: str = "") -> None:
        """Undo inject_fault. Idempotent; raises like inject_fault."""
        with self._lock:
            self._check_fault_target(device_uuid)
            if self._faults.pop(device_uuid, None) is not None:
                self._record(device_uuid, True, "fault cleared")

    def health_events(self) -> list[HealthEvent]:
        with self._lock:
            return list(self._events)

    # ---- pods ------------------------------------------------------------------------------
    def plan(self, pod: PodLaunch, identity: PodIdentity | None = None) -> IsolationPlan:
        """The isolation this pod gets here (starting the MPS daemon when a real slice needs it). A
        pod of another account gets the account's process limit; one that runs as the agent's own
        user does not (RLIMIT_NPROC counts every process of the uid, the agent's included)."""
        node = self.node()
        needs_mps = any(s.compute_milli < 1000 or s.memory_mib for s in pod.slices)
        client_env = None
        if needs_mps and not self.simulated and self._mps.available:
            self._mps.start()
            client_env = self._mps.client_env()
        base_path = pod.env.get("PYTHONPATH", "")  # never the agent's own
        return plan_isolation(pod, node, profiles=self._profiles, mps_client_env=client_env,
                              cgroup_root=self.cgroup_root, base_pythonpath=base_path,
                              nproc=self.pod_processes if identity is not None else None,
                              agent_mark=self.runner.mark)

    def launch(self, pod: PodLaunch) -> PodRecord:
        """Start the pod inside its slice; idempotent by pod id. Returns its record at once.
        Thread-safe: launches of different pods may run concurrently."""
        known = self.runner.known(pod.pod_id)
        if known is not None:
            return known
        _refuse_nul(pod)
        identity = self.identities.resolve(pod.tenant, pod.unix_user, on_behalf=pod.on_behalf)
        secret_env, secret_files = _secrets(pod)  # before anything is made for the pod
        with self._lock:  # planning may start the MPS daemon; the start itself may overlap others
            plan = self.plan(pod, identity)
        limits = prepare_cgroup(plan.host_limits, plan.cgroup_files)
        home = make_private_dir(self.scratch_root, pod.pod_id, identity)
        # secrets as the user's own variables (the pool's win): the pod's environment only
        env = plan.process_env(base_env(identity, home, self.pod_path), {**pod.env, **secret_env})
        env[CHECKPOINT_DIR_ENV] = str(self.checkpoints.prepare(pod.workload_id, identity))  # not the user's
        submit_dir = "" if pod.image else pod.env.get(workdir.SUBMIT_DIR_ENV, "")  # not bound into images
        where = workdir.choose(pod.workdir, submit_dir, identity)
        try:  # last before the start: whatever refuses the pod before it leaves no network behind
            net, network, url = self._attach(pod, identity is not None, env.get("GPUPOOL_URL", ""))
        except Exception:
            if limits.cgroup_dir is not None:
                with contextlib.suppress(OSError):
                    limits.cgroup_dir.rmdir()
            raise
        if net is not None:
            env[POD_ADDRESS_ENV] = net.address
            if pod.world_size > 1:  # gloo takes its address from the host name, which names the node's
                env.setdefault("GLOO_SOCKET_IFNAME", "eth0")  # network, not the pod's (netns.py's eth0)
            if url:
                env["GPUPOOL_URL"] = url
        command, cwd = pod.command, where.path or home
        if pod.image:  # the command runs in the image's container (container.py)
            if pod.mounts or secret_files:  # the server refuses these at submit; a node never half-does them
                raise ProviderError(f"Pod {pod.pod_id} asks for mounts or secret files in image "
                                    f"{pod.image!r}; a container takes secrets as variables only.")
            command, cwd = self._containerised(pod, identity, env, home)
        namespace = None
        try:
            namespace = mounts.prepare(pod.mounts, secret_files, identity, pod.pod_id)
            record = self.runner.start(pod.pod_id, command, env=env, workdir=cwd,
                                       limits=limits, identity=identity,
                                       combined_output=not pod.separate_stderr,
                                       netns=net.netns if net is not None else "", namespace=namespace,
                                       epoch=pod.epoch, net=net.to_json() if net is not None else "")
            if pod.image:
                self.execs.remember(pod.pod_id, IN_IMAGE)
            else:  # gpupool exec: the pod's account, netns, cgroup, limits and environment
                self.execs.remember(pod.pod_id, ExecContext(
                    env=env, identity=identity, netns=net.netns if net is not None else "",
                    cgroup_dir=limits.cgroup_dir, workdir=str(cwd),
                    rlimit_data_bytes=limits.rlimit_data_bytes, rlimit_nproc=limits.rlimit_nproc))
        except Exception:
            if net is not None and self.runner.known(pod.pod_id) is None:
                self._detach(pod.pod_id)  # no record, so no poll would ever end it
            raise
        finally:
            if namespace is not None:
                namespace.close()
        layers = [{"layer": s.layer.value, "active": s.active, "detail": s.detail}
                  for s in (*plan.layers, network)]
        with self._lock:
            write_atomic(self.runner.pod_dir(pod.pod_id) / "isolation.json", json.dumps(layers, indent=1))
            if where.note:  # read back as the pod's "notes" stream (gpupool show)
                write_atomic(self.runner.log_path(pod.pod_id, LogStream.NOTES), where.note + "\n")
        return record

    def _containerised(self, pod: PodLaunch, identity: PodIdentity | None,
                       env: dict[str, str], home: Path) -> tuple[tuple[str, ...], str]:
        """The shim's command and directory for a pod in a container: its bundle (in its private
        directory) runs the pod's command with the pod's environment, in its --workdir or else its
        private directory (bound in, with its checkpoint directory and the MPS pipe); the pod's own
        GPUs' device nodes only."""
        runtime = self.containers
        if runtime is None:
            raise ProviderError(f"Node {self.node_name} cannot run pod {pod.pod_id} in image "
                                f"{pod.image!r}: {self.containers_unavailable}.")
        if not pod.image_rootfs:
            raise ProviderError(f"Image {pod.image!r} of pod {pod.pod_id} is no longer in the pool's store "
                                "(removed after the submit); import it again and resubmit.")
        uid, gid = (identity.uid, identity.gid) if identity is not None else (os.geteuid(), os.getegid())
        inside = container.POD_MOUNT_POINTS
        binds = {inside["home"]: str(home), inside["checkpoint"]: env.get(CHECKPOINT_DIR_ENV, ""),
                 inside["mps"]: env.get("CUDA_MPS_PIPE_DIRECTORY", "")}
        if pod.workdir:
            binds[inside["work"]] = pod.workdir
        pairs = ((str(home), inside["home"]), (str(SITECUSTOMIZE_DIR), inside["site"]),
                 (binds[inside["checkpoint"]], inside["checkpoint"]), (binds[inside["mps"]], inside["mps"]))
        moved = {host: inner for host, inner in pairs if host}
        inner_env = {k: moved.get(v, v) for k, v in env.items()} | pod_mark(self.runner.mark, pod.pod_id)
        if "PYTHONPATH" in env:
            entries = env["PYTHONPATH"].split(os.pathsep)
            inner_env["PYTHONPATH"] = os.pathsep.join(moved.get(p, p) for p in entries)
        devices = [] if self.simulated else container.gpu_device_nodes(s.device_index for s in pod.slices)
        site = _site_copy(home, uid, gid)  # the account may not reach the installed package's own files
        config = container.oci_config(command=pod.command, env=inner_env,
                                      cwd=inside["work"] if pod.workdir else inside["home"], uid=uid, gid=gid,
                                      rootfs=pod.image_rootfs, binds=binds,
                                      read_only_binds={inside["site"]: str(site)},
                                      devices=devices)
        bundle = container.write_bundle(home, config, uid, gid)
        return tuple(container.container_argv(runtime, bundle, pod.pod_id)), pod.workdir or str(home)

    def _attach(self, pod: PodLaunch, as_account: bool, url: str) -> tuple[PodNet | None, LayerState, str]:
        """The pod's own network namespace, when this node makes them (only pods of another
        account: the launcher helper joins it before the uid changes), with `url` (GPUPOOL_URL) as
        the pod reaches it; recorded in the pod's record (runner.start), so a restart finds what to
        remove (an agent that dies before that leaves a namespace no record holds: the next one's
        start removes it, PodNetwork._sweep). With a `lender`, the lender's namespace."""
        if self.lender is not None and as_account:
            net, url, detail = self.lender.lend(pod, url)
            if net is not None:
                self._borrowed.add(pod.pod_id)
            return net, LayerState(Layer.NETWORK, net is not None, detail), url
        if not self.network.active or not as_account:
            why = (self.network.unavailable if as_account or self.lender is None else "") or \
                "the pod runs as the agent's own user: it shares the node's network"
            return None, LayerState(Layer.NETWORK, False, why), ""
        if pod.serve_port and self.network.announce is not None and not self.network.servers:
            return None, LayerState(Layer.NETWORK, False, "a service replica on a Ray node whose plan names "
                                    "no server address shares the node's network (the pool's router reaches "
                                    "it at the node's address)"), ""
        # work others wrote for the tenant is a network of its own: it reaches none of the tenant's own
        # pods' ports, and a namespace one of them leaves is kept for its like only, never the tenant's
        owner = pod.tenant + ON_BEHALF_SUFFIX if pod.on_behalf else pod.tenant
        net = self.network.attach(pod.pod_id, owner, rank=pod.rank, world_size=pod.world_size,
                                  workload_id=pod.workload_id, master_addr=pod.master_addr,
                                  master_port=pod.master_port, serve_port=pod.serve_port)
        served = (f"; the node's port {net.serve_port} is taken to it from the server's addresses "
                  f"({', '.join(net.servers)})" if net.servers else "")
        return (net, LayerState(Layer.NETWORK, True,
                                f"network namespace {net.netns}, address {net.address}{served}"),
                self.network.pod_url(url))

    def _detach(self, pod_id: str) -> None:
        """The pod's namespace may go (its own network's, or given back to the lender)."""
        if pod_id in self._borrowed and self.lender is not None:
            self._borrowed.discard(pod_id)
            self.lender.give_back(pod_id)
        else:
            self.network.detach(pod_id)

    def _detach_ended(self, records: Sequence[PodRecord]) -> None:
        """Remove the namespaces of the pods that ended (their processes are gone)."""
        attached = set(self.network.attached()) | self._borrowed
        if not attached:
            return
        for record in records:
            if record.finished and record.pod_id in attached:
                self._detach(record.pod_id)

    def isolation_layers(self, pod_id: str) -> list[dict[str, object]]:
        """What each isolation layer did for this pod (as recorded at launch)."""
        path = self.runner.pod_dir(pod_id) / "isolation.json"
        try:
            return list(json.loads(path.read_text()))
        except (OSError, ValueError):
            raise NotFound(f"No isolation record for pod {pod_id!r} on this node.") from None

    def fence(self, epoch: int, confirm: Callable[[], None] | None = None) -> int:
        """A new leader's takeover: launches of older epochs are refused from now on (fencing.py)."""
        return self.runner.fence.advance(epoch, confirm)

    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        self.execs.end_pod(pod_id)
        self.runner.stop(pod_id, grace_s)

    def checkpoint_s(self, workload_id: str) -> float | None:
        """The workload's last checkpoint mark on this node (see checkpoints.py), or None."""
        return self.checkpoints.mark_s(workload_id)

    def checkpoint_archive(self, workload_id: str, max_bytes: int) -> tuple[float | None, bytes] | None:
        """The workload's checkpoint directory on this node as a tar, with its mark (checkpoints.py)."""
        return self.checkpoints.archive(workload_id, max_bytes)

    def seed_checkpoint(self, workload_id: str, tenant: str, unix_user: str, data: bytes, *,
                        on_behalf: bool = False) -> int:
        """Fill the workload's checkpoint directory before its first pod, owned by the account its pods
        run as (checkpoints.py; `on_behalf`: the tenant's on-behalf account)."""
        identity = self.identities.resolve(tenant, unix_user, on_behalf=on_behalf)
        return self.checkpoints.seed(workload_id, identity, data)

    def forget_workload(self, workload_id: str) -> None:
        """Remove the workload's checkpoint directory on this node (it ended for good)."""
        self.checkpoints.forget(workload_id)

    def poll(self) -> list[PodRecord]:
        records = self.runner.poll()
        self._detach_ended(records)
        for record in records:
            if record.finished:
                self.execs.end_pod(record.pod_id)
        if self.disk_guard is not None:
            self.disk_guard.tick()  # a statvfs per filesystem at most every second; more only when full
        return records

    def forget_pods(self, pod_ids: Iterable[str]) -> None:
        """poll() no longer returns these finished pods (see Runner.forget)."""
        self.runner.forget(pod_ids)

    def read_log(self, pod_id: str, stream: str = "stdout", offset: int = 0) -> LogChunk:
        return self.runner.read_log(pod_id, stream, offset)

    def follow_log(self, pod_id: str, stream: str = "stdout", *, offset: int = 0,
                   timeout_s: float | None = None) -> Iterator[str]:
        return self.runner.follow_log(pod_id, LogStream(stream), offset=offset, timeout_s=timeout_s)

    def close(self, *, stop_pods: bool = False) -> None:
        """Stop timers (and pods if asked), the MPS daemon and NVML. Idempotent."""
        self.runner.close(stop_pods=stop_pods)
        if stop_pods:
            self._detach_ended(self.runner.poll())
            self._mps.stop()
        self.network.close()
        self._probe.close()


def _runs(record: PodRecord) -> bool:
    """Whether the pod of `record` may still run (not ended, and its process, when saved, lives)."""
    return not record.finished and (record.pid is None or process_alive(record.pid, record.start_ticks))


def _secrets(pod: PodLaunch) -> tuple[dict[str, str], dict[str, bytes]]:
    """The pod's secrets as variables and files (pods.secret_injection); InvalidInput with the
    sentence for one that cannot be given (deleted since the submit, or changed keys)."""
    env: dict[str, str] = {}
    files: dict[str, bytes] = {}
    for secret in pod.secrets:
        try:
            more_env, more_files = secret_injection(secret)
        except ValueError as exc:
            raise InvalidInput(f"Pod {pod.pod_id}: {exc}.") from None
        env.update(more_env)
        files.update(more_files)
    return env, files


def _refuse_nul(pod: PodLaunch) -> None:
    """A NUL byte cannot be passed to exec or a filesystem call; the API refuses it, and this keeps a
    spec stored before it did from failing deep in the launch."""
    fields = {"command": pod.command, "environment": [*pod.env, *pod.env.values()], "workdir": [pod.workdir]}
    for field, texts in fields.items():
        if any("\x00" in text for text in texts):
            raise InvalidInput(f"Pod {pod.pod_id}: its {field} holds a NUL byte, which no program can be "
                               "given; resubmit the workload without it.")


def _site_copy(home: Path, uid: int, gid: int) -> Path:
    """The pool's sitecustomize copied into the pod's private directory, owned by its account: crun
    runs as that account and binds what it can reach, and the package's own directory may lie under a
    path the account cannot enter (a 0700 checkout, a root-only virtualenv). Written through
    descriptors that follow no symlink: the account can write to `home` (`open_owned_dir`)."""
    site = open_owned_dir(home, SITE_DIR, 0o755, uid, gid)
    try:
        for source in SITECUSTOMIZE_DIR.glob("*.py"):
            write_owned_file(site, source.name, source.read_bytes(), 0o444, uid, gid)
    finally:
        os.close(site)
    return home / SITE_DIR
