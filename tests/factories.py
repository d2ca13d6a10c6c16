"""Builders for the tests: small clusters, pods and workloads with sensible defaults."""

from __future__ import annotations

import itertools

from gpupool.core.model import Device, Node, PodRequest, Workload

ISSUE_CONFIG = """\
scheduling:
  placement: fgd-strand
  ordering: drf
  preemption: true
  backfill: true
priority_classes:
  - {name: low, value: 0, preemptible: true, grace: 5s}
  - {name: high, value: 1000}
"""
"""The pool configuration the live-scheduler issue requires be accepted as written."""


_ids = itertools.count()

POLICY_NAMES = (
    "random",
    "first-fit",
    "best-fit",
    "worst-fit",
    "dot-product",
    "gpu-packing",
    "gpu-clustering",
    "fgd",
    "fgd-balance",
    "fgd-strand",
    "fgd-plan",
    "network-aware",
)
"""Every built-in placement policy; the policy tests run each of them."""


def node(
    name: str = "",
    *,
    devices: int = 8,
    model: str = "V100M32",
    cpu_milli: int = 64_000,
    memory_mib: int = 262_144,
    device_memory_mib: int = 32_768,
) -> Node:
    name = name or f"node-{next(_ids)}"
    devs = tuple(
        Device(uuid=f"{name}-dev{i}", model=model, index=i, memory_mib=device_memory_mib)
        for i in range(devices)
    )
    return Node(name=name, cpu_milli=cpu_milli, memory_mib=memory_mib, devices=devs)


def cluster(count: int, **kwargs: object) -> list[Node]:
    return [node(f"n{i:03d}", **kwargs) for i in range(count)]  # type: ignore[arg-type]


def pod(
    gpus: float = 1,
    *,
    cpu_milli: int = 1000,
    memory_mib: int = 1024,
    device_memory_mib: int = 0,
    models: frozenset[str] = frozenset(),
    name: str = "",
) -> PodRequest:
    if gpus <= 0:
        num, milli = 0, 0
    elif gpus < 1:
        num, milli = 1, round(gpus * 1000)
    else:
        num, milli = int(gpus), 1000
    return PodRequest(
        name=name or f"pod-{next(_ids)}",
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        num_devices=num,
        device_milli=milli,
        device_memory_mib=device_memory_mib,
        allowed_models=models,
    )


def workload(*pods: PodRequest, wid: str = "", priority: int = 0, submit_s: float = 0.0,
             tenant: str = "default") -> Workload:
    return Workload(
        id=wid or f"w-{next(_ids)}",
        pods=pods or (pod(),),
        priority=priority,
        submit_time_s=submit_s,
        tenant=tenant,
    )


def pod_python() -> str:
    """A Python a pod can run: the system's (pods may run as other accounts, and this test run's
    interpreter may live in a directory only its owner can enter), else this one."""
    import shutil
    import sys

    from gpupool.agent.identity import BASE_PATH

    return shutil.which("python3", path=BASE_PATH) or sys.executable


ALL_REDUCE = """
import os, pathlib, socket, sys, time
rank, world = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])  # pods, whatever their devices
where = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
value = rank + 1
if rank == 0:
    server = socket.create_server(where)
    server.settimeout(60)
    peers = [server.accept()[0] for _ in range(world - 1)]
    total = value + sum(int(peer.makefile().readline()) for peer in peers)
    for peer in peers:
        peer.sendall(f"{total}\\n".encode())
    meet = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else None
    if meet is not None:  # hold the port until every gang's rank 0 holds its own
        (meet / os.environ["MASTER_PORT"]).touch()
        deadline = time.monotonic() + 60
        while len(list(meet.iterdir())) < int(sys.argv[2]) and time.monotonic() < deadline:
            time.sleep(0.05)
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            peer = socket.create_connection(where, timeout=60)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    peer.sendall(f"{value}\\n".encode())
    total = int(peer.makefile().readline())
print(f"rank {rank} of {world} on {os.environ['GPUPOOL_NODE']} at port {where[1]}: sum {total}", flush=True)
"""
"""A gang's real rendezvous, for `python -c ALL_REDUCE [MEET_DIR N]`: rank 0 listens on MASTER_ADDR:
MASTER_PORT, every pod sends NODE_RANK + 1 over TCP, all print the sum; with MEET_DIR, rank 0 keeps its
port until N gangs' rank 0 hold theirs (two gangs at once)."""


BUSYBOX_APPLETS = ("sh", "id", "ls", "cat", "echo", "sleep", "true", "test", "stat")


def static_busybox() -> str | None:
    """The path of a statically linked busybox (Debian's busybox-static), None when there is none: an
    image built from it needs nothing else of the host."""
    import shutil
    import struct

    for candidate in ("/bin/busybox", "/usr/bin/busybox", shutil.which("busybox") or ""):
        try:
            with open(candidate, "rb") as handle:
                head = handle.read(64)
                if head[:5] != b"\x7fELF\x02":
                    continue
                phoff, = struct.unpack_from("<Q", head, 0x20)
                entsize, count = struct.unpack_from("<HH", head, 0x36)
                handle.seek(phoff)
                table = handle.read(entsize * count)
        except OSError:
            continue
        if all(struct.unpack_from("<I", table, i * entsize)[0] != 3 for i in range(count)):  # no PT_INTERP
            return candidate
    return None


def busybox_image_tar(os_release: str = "NAME=tiny\n") -> bytes:
    """A tar of a tiny root filesystem: a static busybox with a few applets and an /etc/os-release."""
    import io
    import tarfile

    busybox = static_busybox()
    assert busybox is not None, "no static busybox (apt-get install busybox-static)"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(busybox, arcname="bin/busybox")
        for applet in BUSYBOX_APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            archive.addfile(link)
        data = os_release.encode()
        info = tarfile.TarInfo("etc/os-release")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
