"""How `node ls` reports each layer: enforced, advisory or unenforced."""

from __future__ import annotations

from dataclasses import replace

from gpupool.api.nodes import LayerOut
from gpupool.providers.base import Capability
from gpupool.providers.fake import nodes_from_spec
from gpupool.server.services.enforcement import DEVICES, HOST_LIMITS, PROC, Level, node_layers


def _real(spec: str):  # type: ignore[no-untyped-def]
    node = nodes_from_spec(spec)[0]
    return replace(node, devices=tuple(replace(d, simulated=False) for d in node.devices))


def test_devices_on_real_gpus_are_advisory_without_device_cgroup_rules() -> None:
    node = _real("1x2xH100")
    assert not any(d.simulated for d in node.devices)
    by_layer = {s.layer: s for s in node_layers(node, {})}
    devices = by_layer[DEVICES]
    assert devices.level is Level.ADVISORY and not devices.enforced
    assert "device cgroup" in devices.detail
    assert by_layer[HOST_LIMITS].level is Level.ENFORCED and by_layer[HOST_LIMITS].enforced
    out = LayerOut(layer=devices.layer, enforced=devices.enforced, level=devices.level.value,
                   detail=devices.detail)
    assert out.level == "advisory" and out.enforced is False


def test_simulated_devices_and_missing_layers_are_unenforced() -> None:
    node = nodes_from_spec("1x2xH100")[0]
    simulated = replace(node, devices=tuple(replace(d, simulated=True) for d in node.devices))
    by_layer = {s.layer: s for s in node_layers(simulated, {Capability.CGROUPS: "no cgroup"})}
    assert by_layer[DEVICES].level is Level.UNENFORCED and not by_layer[DEVICES].enforced
    assert by_layer[HOST_LIMITS].level is Level.UNENFORCED and by_layer[HOST_LIMITS].detail == "no cgroup"


def test_proc_is_enforced_only_when_hidden_and_pods_have_their_own_accounts() -> None:
    node = _real("1x2xH100")
    hidden = {s.layer: s for s in node_layers(node, {})}[PROC]
    assert hidden.level is Level.ENFORCED and "hidepid=2" in hidden.detail
    why = "/proc is mounted without hidepid; mount -o remount,hidepid=2,gid=GROUP /proc"
    visible = {s.layer: s for s in node_layers(node, {Capability.HIDDEN_PROCESSES: why})}[PROC]
    assert visible.level is Level.UNENFORCED and visible.detail == why
    one_account = {s.layer: s for s in node_layers(node, {Capability.USER_ISOLATION: "not root"})}[PROC]
    assert one_account.level is Level.UNENFORCED and "agent's own account" in one_account.detail
    fake = {s.layer: s for s in node_layers(node, {Capability.REAL_PROCESSES: "fake"})}[PROC]
    assert fake.level is Level.UNENFORCED and fake.detail == "fake"
