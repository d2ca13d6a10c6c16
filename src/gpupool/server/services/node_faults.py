"""Injected faults on simulated and fake nodes: fail, heal, and their return after a restart.

A fault is injected into the provider (which then reports the device or node unhealthy, so the
control loop evicts what runs there) and kept in `node_flags.failed` / `failed_devices`, so a
restarted server injects it again before its loop starts.
"""

from __future__ import annotations

import logging

from sqlalchemy import select

from gpupool.api.nodes import NodeOut
from gpupool.core.model import Device, Node
from gpupool.errors import Conflict, GpupoolError, NotFound
from gpupool.providers.base import Capability
from gpupool.server.auth import Principal
from gpupool.server.orm import NodeFlagRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import audit
from gpupool.server.services.nodes import after_change, find, get_node, is_lost, locked_flags

log = logging.getLogger(__name__)


def _device(node: Node, index: int) -> Device:
    for device in node.devices:
        if device.index == index:
            return device
    have = f"its devices are 0-{len(node.devices) - 1}" if node.devices else "it has no devices"
    raise NotFound(f"Node {node.name!r} has no device {index}; {have} (see `gpupool node show {node.name}`).",
                   node=node.name, device=index)


def refusal(rt: Runtime, node: Node, device: int | None) -> str | None:
    """Why a fault cannot be injected on `node` (or its device `device`), or None when it can."""
    devices = (_device(node, device),) if device is not None else node.devices
    if not devices or any(not d.simulated for d in devices):
        what = f"Device {device} of node {node.name!r}" if device is not None else f"Node {node.name!r}"
        return (f"{what} is real hardware; faults can be injected only on simulated devices "
                "(gpupool up --simulate) and the fake provider's nodes.")
    missing = rt.provider.missing_capabilities().get(Capability.FAULT_INJECTION)
    if missing is not None:
        return f"The {rt.provider.name} provider cannot inject faults ({missing})."
    return None


def fail(rt: Runtime, who: Principal, name: str, device: int | None = None) -> NodeOut:
    """Admin: mark a simulated node (or one of its devices) unhealthy, as a hardware fault would;
    the control loop then evicts the work on it. Refused on real hardware (Conflict)."""
    who.require_admin()
    node = find(rt, name)
    reason = refusal(rt, node, device)
    if reason is not None:
        raise Conflict(reason, node=name, device=device)
    uuid = _device(node, device).uuid if device is not None else ""
    rt.provider.inject_fault(name, uuid, reason=f"fault injected by {who.actor}")
    now = rt.clock()
    with rt.store.write() as session:
        row = locked_flags(session, name, now)
        if device is None:
            row.failed = True
        else:
            row.failed_devices = sorted({*row.failed_devices, device})  # a new list: JSON compares by value
        row.updated_s = now
        audit.record(session, who, "node.fail", name, now, "node" if device is None else f"device {device}")
    rt.refresh_nodes()
    rt.capacity_may_have_changed()
    return get_node(rt, who, name)


def heal(rt: Runtime, who: Principal, name: str, device: int | None = None) -> NodeOut:
    """Admin: clear the injected fault of one device, or with no device every injected fault of the
    node. A lost node's stored faults are cleared from the store alone."""
    who.require_admin()
    lost = is_lost(rt, name)
    if not lost:
        node = find(rt, name)
        reason = refusal(rt, node, device)
        if reason is not None and not _stored(rt, name, device):
            raise Conflict(reason, node=name, device=device)
        if reason is None:  # every device too: the provider's faults may be more than the store's
            targets = [_device(node, device)] if device is not None else list(node.devices)
            for uuid in ([] if device is not None else [""]) + [d.uuid for d in targets]:
                rt.provider.clear_fault(name, uuid)
    now = rt.clock()
    with rt.store.write() as session:
        row = locked_flags(session, name, now)
        if device is None:
            row.failed, row.failed_devices = False, []
        else:
            row.failed_devices = [i for i in row.failed_devices if i != device]
        row.updated_s = now
        audit.record(session, who, "node.heal", name, now, "node" if device is None else f"device {device}")
    rt.refresh_nodes()
    rt.capacity_may_have_changed()
    return after_change(rt, who, name, lost)


def _stored(rt: Runtime, name: str, device: int | None) -> bool:
    """Whether the store holds an injected fault for that target (healable even where the provider
    can no longer inject, e.g. after a restart onto real hardware of the same name)."""
    with rt.store.read() as session:
        row = session.get(NodeFlagRow, name)
    if row is None:
        return False
    return device in row.failed_devices if device is not None else bool(row.failed or row.failed_devices)


def restore(rt: Runtime) -> int:
    """Inject every stored fault into the provider again (at start-up, before the control loop's
    first cycle). A fault that cannot be restored (its node gone, real hardware now) is logged and
    kept in the store, where `gpupool node heal` clears it. Returns how many were injected."""
    with rt.store.read() as session:
        rows = [(r.name, r.failed, list(r.failed_devices)) for r in session.scalars(select(NodeFlagRow))
                if r.failed or r.failed_devices]  # one row per node ever flagged: few
    live = {n.name: n for n in rt.nodes()}
    restored = 0
    for name, failed, devices in sorted(rows):
        node = live.get(name)
        for device in ([None] if failed else []) + [int(i) for i in devices]:
            try:
                if node is None:
                    raise NotFound(f"the provider does not list node {name!r}")
                reason = refusal(rt, node, device)
                if reason is not None:
                    raise Conflict(reason)
                rt.provider.inject_fault(name, _device(node, device).uuid if device is not None else "",
                                         reason="fault injected before the server restarted")
                restored += 1
            except GpupoolError as exc:
                what = f"node {name}" if device is None else f"device {device} of node {name}"
                log.warning("The injected fault on %s was not restored: %s", what, exc.message)
    if restored:
        rt.refresh_nodes()
    return restored
