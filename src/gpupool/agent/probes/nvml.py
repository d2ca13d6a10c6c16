"""Discover NVIDIA devices through NVML (nvidia-ml-py): identity, memory, load, health, MIG, processes.

pynvml is imported lazily. When the library or the driver is missing the probe returns a status and
one clear line, never an exception, so a machine without GPUs simply reports none.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from enum import StrEnum
from types import ModuleType
from typing import Any

from gpupool.core.model import Device, DeviceKind
from gpupool.profiles import ProfileSet, default_profiles

# XIDs that report an application's own fault (bad kernel, MMU fault in user code, preemption
# clean-up): they do not make the device unhealthy. Every other critical XID does.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


class ProbeStatus(StrEnum):
    OK = "ok"
    NO_LIBRARY = "no_library"
    NO_DRIVER = "no_driver"
    NO_DEVICES = "no_devices"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_memory_mib: int


@dataclass(frozen=True, slots=True)
class XidEvent:
    device_uuid: str
    xid: int

    @property
    def critical(self) -> bool:
        return self.xid not in APPLICATION_XIDS


@dataclass(frozen=True, slots=True)
class ProbedDevice:
    """One device as NVML reports it now."""

    index: int
    uuid: str
    name: str
    model: str
    profile_known: bool
    memory_total_mib: int
    memory_used_mib: int
    utilization_pct: int | None
    temperature_c: int | None
    mig_enabled: bool | None
    processes: tuple[GpuProcess, ...]
    healthy: bool = True
    xids: tuple[int, ...] = ()

    def to_device(self) -> Device:
        return Device(uuid=self.uuid, model=self.model, index=self.index, memory_mib=self.memory_total_mib,
                      kind=DeviceKind.GPU, healthy=self.healthy, simulated=False)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    status: ProbeStatus
    message: str
    devices: tuple[ProbedDevice, ...] = ()
    driver_version: str = ""


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def model_for_nvml_name(name: str, memory_mib: int, profiles: ProfileSet | None = None) -> str | None:
    """The profile model an NVML device name maps to, or None.

    Exact alias first ("NVIDIA H100 80GB HBM3"), then without the vendor prefix, then the longest
    profile name contained in the NVML name whose memory agrees within 10 %.
    """
    profiles = profiles or default_profiles()
    for candidate in (name, re.sub(r"^(nvidia|tesla)\s+", "", name, flags=re.IGNORECASE)):
        profile = profiles.find(candidate)
        if profile is not None:
            return profile.model
    best: tuple[int, str] | None = None
    key = _key(name)
    for profile in profiles.values():
        if profile.memory_known and abs(profile.memory_mib - memory_mib) > 0.1 * profile.memory_mib:
            continue
        for label in profile.names():
            label_key = _key(label)
            if len(label_key) >= 2 and label_key in key and (best is None or len(label_key) > best[0]):
                best = (len(label_key), profile.model)
    return best[1] if best else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlProbe:
    """Reads NVIDIA devices. `nvml` injects a pynvml-compatible module (tests); default pynvml."""

    def __init__(self, nvml: ModuleType | None = None, profiles: ProfileSet | None = None) -> None:
        self._nvml = nvml
        self._profiles = profiles
        self._initialised = False
        self._events: Any = None
        self._unhealthy: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def _init(self) -> tuple[ModuleType | None, ProbeResult | None]:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                return None, ProbeResult(ProbeStatus.NO_LIBRARY, "NVML unavailable: nvidia-ml-py is not "
                                         "installed; no NVIDIA devices will be reported.")
            self._nvml = pynvml
        nvml = self._nvml
        if not self._initialised:
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                return None, ProbeResult(ProbeStatus.NO_DRIVER, f"NVML unavailable: {_text(exc)} (no NVIDIA "
                                         "driver on this machine); no NVIDIA devices will be reported.")
            self._initialised = True
        return nvml, None

    def probe(self) -> ProbeResult:
        """Every device now. Never raises: problems come back as status + message."""
        with self._lock:
            nvml, failure = self._init()
            if failure is not None or nvml is None:
                return failure or ProbeResult(ProbeStatus.ERROR, "NVML unavailable.")
            try:
                driver = _text(nvml.nvmlSystemGetDriverVersion())
                count = nvml.nvmlDeviceGetCount()
                devices = tuple(self._device(nvml, i) for i in range(count))
            except nvml.NVMLError as exc:
                return ProbeResult(ProbeStatus.ERROR, f"NVML error while reading devices: {_text(exc)}.")
        if not devices:
            return ProbeResult(ProbeStatus.NO_DEVICES, "NVML found no NVIDIA devices.", driver_version=driver)
        return ProbeResult(ProbeStatus.OK, f"{len(devices)} NVIDIA device(s), driver {driver}.",
                           devices, driver)

    def _optional(self, nvml: ModuleType, func: Any, *args: Any) -> Any:
        try:
            return func(*args)
        except nvml.NVMLError:  # NotSupported on some boards (temperature, MIG, utilisation)
            return None

    def _device(self, nvml: ModuleType, index: int) -> ProbedDevice:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid, name = _text(nvml.nvmlDeviceGetUUID(handle)), _text(nvml.nvmlDeviceGetName(handle))
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        total_mib = int(memory.total) // 2**20
        util = self._optional(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
        temp = self._optional(nvml, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        mig = self._optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
        procs = self._optional(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        model = model_for_nvml_name(name, total_mib, self._profiles)
        xids = tuple(self._unhealthy.get(uuid, ()))
        return ProbedDevice(
            index=index, uuid=uuid, name=name, model=model or name, profile_known=model is not None,
            memory_total_mib=total_mib, memory_used_mib=int(memory.used) // 2**20,
            utilization_pct=int(util.gpu) if util is not None else None,
            temperature_c=int(temp) if temp is not None else None,
            mig_enabled=bool(mig[0]) if mig is not None else None,
            processes=tuple(GpuProcess(int(p.pid), int(p.usedGpuMemory or 0) // 2**20) for p in procs),
            healthy=not xids, xids=xids)

    def poll_xid_events(self, timeout_ms: int = 0) -> list[XidEvent]:
        """Critical XID events since the last call; a critical one marks its device unhealthy."""
        with self._lock:
            nvml, failure = self._init()
            if nvml is None or failure is not None:
                return []
            try:
                if self._events is None:
                    self._events = nvml.nvmlEventSetCreate()
                    for i in range(nvml.nvmlDeviceGetCount()):
                        handle = nvml.nvmlDeviceGetHandleByIndex(i)
                        self._optional(nvml, nvml.nvmlDeviceRegisterEvents, handle,
                                       nvml.nvmlEventTypeXidCriticalError, self._events)
                found: list[XidEvent] = []
                while True:
                    try:
                        data = nvml.nvmlEventSetWait(self._events, timeout_ms)
                    except nvml.NVMLError:  # Timeout: nothing (more) pending
                        break
                    event = XidEvent(_text(nvml.nvmlDeviceGetUUID(data.device)), int(data.eventData))
                    found.append(event)
                    if event.critical:
                        self._unhealthy.setdefault(event.device_uuid, []).append(event.xid)
                    timeout_ms = 0
            except nvml.NVMLError:
                return []
            return found

    def close(self) -> None:
        """Free the event set and shut NVML down. Idempotent."""
        with self._lock:
            if self._initialised and self._nvml is not None:
                if self._events is not None:
                    self._optional(self._nvml, self._nvml.nvmlEventSetFree, self._events)
                    self._events = None
                self._optional(self._nvml, self._nvml.nvmlShutdown)
                self._initialised = False
