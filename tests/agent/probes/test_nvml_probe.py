"""The NVML probe against a stand-in pynvml module: fields, profile mapping, XID health, no driver."""

from __future__ import annotations

import types
from dataclasses import dataclass

import pytest

from gpupool.agent.probes.nvml import NvmlProbe, ProbeStatus, model_for_nvml_name


class NVMLError(Exception):
    pass


@dataclass
class Mem:
    total: int
    used: int


@dataclass
class Util:
    gpu: int


@dataclass
class Proc:
    pid: int
    usedGpuMemory: int | None


@dataclass
class Event:
    device: str
    eventData: int


def fake_nvml(*, init_error: str = "", events: list[Event] | None = None) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    devices = {"h0": ("GPU-aaa", "NVIDIA H100 80GB HBM3", 81559), "h1": ("GPU-bbb", "NVIDIA Mystery", 1024)}
    pending = list(events or [])

    def init() -> None:
        if init_error:
            raise NVMLError(init_error)

    def not_supported(*_: object) -> None:
        raise NVMLError("Not Supported")

    def wait(_set: object, _timeout: int) -> Event:
        if not pending:
            raise NVMLError("Timeout")
        return pending.pop(0)

    nvml.__dict__.update(
        NVMLError=NVMLError, NVML_TEMPERATURE_GPU=0, nvmlEventTypeXidCriticalError=8,
        nvmlInit=init, nvmlShutdown=lambda: None, nvmlSystemGetDriverVersion=lambda: "550.54",
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetUUID=lambda h: devices[h][0], nvmlDeviceGetName=lambda h: devices[h][1],
        nvmlDeviceGetMemoryInfo=lambda h: Mem(devices[h][2] * 2**20, 512 * 2**20),
        nvmlDeviceGetUtilizationRates=lambda h: Util(37),
        nvmlDeviceGetTemperature=lambda h, _k: 61 if h == "h0" else not_supported(),
        nvmlDeviceGetMigMode=lambda h: [1, 1] if h == "h0" else not_supported(),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [Proc(4242, 300 * 2**20)] if h == "h0" else [],
        nvmlEventSetCreate=lambda: "set", nvmlDeviceRegisterEvents=lambda h, t, s: None,
        nvmlEventSetWait=wait, nvmlEventSetFree=lambda s: None,
    )
    return nvml


def test_probe_reads_every_field() -> None:
    result = NvmlProbe(fake_nvml()).probe()
    assert result.status is ProbeStatus.OK and result.driver_version == "550.54"
    h100, other = result.devices
    assert (h100.uuid, h100.model, h100.profile_known) == ("GPU-aaa", "H100-SXM-80GB", True)
    assert (h100.memory_total_mib, h100.memory_used_mib, h100.utilization_pct) == (81559, 512, 37)
    assert (h100.temperature_c, h100.mig_enabled) == (61, True)
    assert [(p.pid, p.used_memory_mib) for p in h100.processes] == [(4242, 300)]
    assert (other.model, other.profile_known, other.temperature_c, other.mig_enabled) == (
        "NVIDIA Mystery", False, None, None)
    assert h100.to_device().memory_mib == 81559 and not h100.to_device().simulated


def test_critical_xid_marks_the_device_unhealthy() -> None:
    probe = NvmlProbe(fake_nvml(events=[Event("h1", 13), Event("h0", 79)]))
    events = probe.poll_xid_events()
    assert [(e.device_uuid, e.xid, e.critical) for e in events] == [
        ("GPU-bbb", 13, False), ("GPU-aaa", 79, True)]
    h100, other = probe.probe().devices
    assert not h100.healthy and h100.xids == (79,)
    assert other.healthy  # XID 13 is the application's fault, not the device's


def test_missing_driver_is_one_line_not_an_exception() -> None:
    probe = NvmlProbe(fake_nvml(init_error="Driver Not Loaded"))
    result = probe.probe()
    assert result.status is ProbeStatus.NO_DRIVER and result.devices == ()
    assert "Driver Not Loaded" in result.message and "\n" not in result.message
    assert probe.poll_xid_events() == []
    probe.close()


@pytest.mark.parametrize(
    ("name", "memory_mib", "model"),
    [("NVIDIA H100 80GB HBM3", 81559, "H100-SXM-80GB"), ("NVIDIA H200", 143771, "H200"),
     ("Tesla V100-SXM2-32GB", 32510, "V100M32"), ("Tesla V100-SXM2-16GB", 16160, "V100M16"),
     ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"), ("Tesla T4", 15360, "T4"),
     ("NVIDIA L40S", 46068, "L40S"), ("NVIDIA A10", 22731, "A10"), ("Tesla P100-PCIE-16GB", 16280, "P100"),
     ("NVIDIA GeForce RTX 4090", 24564, None)],
)
def test_nvml_names_map_to_profiles(name: str, memory_mib: int, model: str | None) -> None:
    assert model_for_nvml_name(name, memory_mib) == model
