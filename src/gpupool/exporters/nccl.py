"""NCCL settings for a placement (NCCL_IB_HCA, NCCL_IB_SL, NCCL_IB_PKEY) and an NCCL_TOPO_FILE XML."""

from __future__ import annotations

import re
from collections.abc import Sequence
from xml.etree import ElementTree as ET

from gpupool.core.fabric.model import Fabric
from gpupool.core.fabric.qos import QosClass
from gpupool.errors import InvalidInput
from gpupool.exporters.slurm import host_of

_DEVICE = re.compile(r"\s((?:mlx\d+|hfi\d+|bnxt_re|irdma)_?\d+)$")
PCI_SPEED = "32.0 GT/s PCIe"


def hca_device(fabric: Fabric, ca: str) -> str:
    """The kernel device name ("mlx5_0") from a NodeDescription such as "gpu0001 mlx5_0"."""
    match = _DEVICE.search(" " + fabric.nodes[ca].desc)
    if not match:
        raise InvalidInput(
            f"Cannot tell the HCA device of {fabric.nodes[ca].label}: its description "
            f"{fabric.nodes[ca].desc!r} does not end in a device name such as mlx5_0."
        )
    return match.group(1)


def host_cas(fabric: Fabric, host: str) -> list[str]:
    cas = [ca for ca in fabric.cas if host_of(fabric, ca) == host]
    if not cas:
        raise InvalidInput(f"No HCA of host {host!r} is in the fabric; check the host name.")
    return sorted(cas, key=lambda ca: hca_device(fabric, ca))


def nccl_env(
    fabric: Fabric,
    host: str,
    qos: QosClass | None = None,
    pkey_index: int | None = None,
) -> dict[str, str]:
    """Environment for NCCL on `host`: its HCAs (device:port, exact match), SL and P_Key index.

    NCCL_IB_PKEY is an index into the port's P_Key table, not the P_Key itself; with the
    partitions.conf gpupool writes, the default partition sits at index 0 and the tenant's at 1.
    """
    hcas = []
    for ca in host_cas(fabric, host):
        port = fabric.ca_leaf[ca][2].port_on(ca) if ca in fabric.ca_leaf else 1
        hcas.append(f"{hca_device(fabric, ca)}:{port}")
    env = {"NCCL_IB_HCA": "=" + ",".join(hcas)}
    if qos is not None:
        env["NCCL_IB_SL"] = str(qos.sl)
    if pkey_index is not None:
        env["NCCL_IB_PKEY"] = str(pkey_index)
    return env


def topo_xml(fabric: Fabric, host: str, gpus: int = 8, numa_nodes: int = 2) -> str:
    """An NCCL_TOPO_FILE: per NUMA node a CPU, under it one PCIe bridge per GPU holding that GPU and
    its rail's NIC (the layout of production 8-GPU + 8-HCA nodes). Bus IDs follow the Azure ND
    skeletons (GPU i at 000i:00:00.0, its NIC at 010i:00:00.0); edit them to the host's lspci."""
    nics = [hca_device(fabric, ca) for ca in host_cas(fabric, host)]
    if gpus < 1 or numa_nodes < 1 or gpus % numa_nodes:
        raise InvalidInput(f"{gpus} GPUs do not split evenly over {numa_nodes} NUMA nodes.")
    system = ET.Element("system", version="1")
    per_numa = gpus // numa_nodes
    for numa in range(numa_nodes):
        cpu = ET.SubElement(
            system, "cpu", numaid=str(numa), affinity=_affinity(numa, numa_nodes), arch="x86_64"
        )
        for slot in range(per_numa):
            gpu = numa * per_numa + slot
            bridge = ET.SubElement(cpu, "pci", _link(f"ffff:ff:{gpu + 1:02x}.0", "0x060400"))
            ET.SubElement(bridge, "pci", _link(f"{gpu + 1:04x}:00:00.0", "0x030200"))
            if gpu < len(nics):
                ET.SubElement(bridge, "pci", _link(f"{0x101 + gpu:04x}:00:00.0", "0x020700"))
    ET.indent(system, space="  ")
    return ET.tostring(system, encoding="unicode") + "\n"


def _link(busid: str, cls: str) -> dict[str, str]:
    return {"busid": busid, "class": cls, "link_speed": PCI_SPEED, "link_width": "16"}


def _affinity(numa: int, numa_nodes: int, cores: int = 96) -> str:
    per = cores // numa_nodes
    mask = ((1 << per) - 1) << (numa * per)
    text = f"{mask:0{cores // 4}x}"
    return ",".join(text[i : i + 8] for i in range(0, len(text), 8))


def placement_env(
    fabric: Fabric, hosts: Sequence[str], qos: QosClass | None = None, pkey_index: int | None = None
) -> dict[str, dict[str, str]]:
    """nccl_env for every host of a placement."""
    return {host: nccl_env(fabric, host, qos, pkey_index) for host in hosts}
