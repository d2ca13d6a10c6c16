"""Read InfiniBand ports from sysfs (/sys/class/infiniband): state, rate, LID and counters."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.core.fabric.telemetry import CounterSample

SYSFS_ROOT = Path("/sys/class/infiniband")
_CODE_TEXT = re.compile(r"^\s*(\d+)\s*:\s*(.*?)\s*$")
_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec")


@dataclass(frozen=True)
class IbPortSample:
    """One HCA port as sysfs shows it; counters are None where the port reads "N/A (no PMA)"."""

    hca: str
    port: int
    state: str
    state_code: int | None
    phys_state: str
    phys_state_code: int | None
    rate_gbps: float | None
    lid: int | None
    link_layer: str
    node_guid: int | None
    time_s: float
    counters: dict[str, int | None] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.state.upper() == "ACTIVE"

    def to_counter_sample(self) -> CounterSample:
        return CounterSample(self.hca, self.port, self.time_s, self.counters, self.rate_gbps)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def parse_code_text(text: str | None) -> tuple[int | None, str]:
    """'4: ACTIVE' -> (4, 'ACTIVE'); 'LinkUp' -> (None, 'LinkUp'); None -> (None, '')."""
    if not text:
        return None, ""
    match = _CODE_TEXT.match(text)
    if match:
        return int(match.group(1)), match.group(2)
    return None, text.strip()


def parse_rate_gbps(text: str | None) -> float | None:
    """'100 Gb/sec (4X EDR)' -> 100.0."""
    match = _RATE.match(text or "")
    return float(match.group(1)) if match else None


def parse_counter(text: str | None) -> int | None:
    """A counter file's integer, or None for 'N/A (no PMA)' and unreadable files."""
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def parse_guid(text: str | None) -> int | None:
    """'0a7f:bc12:45ef:d23b' -> 0x0a7fbc1245efd23b."""
    if not text:
        return None
    try:
        return int(text.replace(":", "")[:16], 16)
    except ValueError:
        return None


def read_port(hca_dir: Path, port_dir: Path, now_s: float) -> IbPortSample:
    state_code, state = parse_code_text(_read(port_dir / "state"))
    phys_code, phys = parse_code_text(_read(port_dir / "phys_state"))
    lid_text = _read(port_dir / "lid")
    counters_dir = port_dir / "counters"
    counters = (
        {f.name: parse_counter(_read(f)) for f in sorted(counters_dir.iterdir()) if f.is_file()}
        if counters_dir.is_dir()
        else {}
    )
    return IbPortSample(
        hca=hca_dir.name,
        port=int(port_dir.name),
        state=state,
        state_code=state_code,
        phys_state=phys,
        phys_state_code=phys_code,
        rate_gbps=parse_rate_gbps(_read(port_dir / "rate")),
        lid=parse_counter(lid_text),
        link_layer=_read(port_dir / "link_layer") or "",
        node_guid=parse_guid(_read(hca_dir / "node_guid")),
        time_s=now_s,
        counters=counters,
    )


def read_ib_ports(
    root: Path = SYSFS_ROOT, clock: Callable[[], float] = time.monotonic
) -> list[IbPortSample]:
    """Every port of every HCA under `root`, sorted by (hca, port); [] when there is no IB stack."""
    if not root.is_dir():
        return []
    samples: list[IbPortSample] = []
    for hca_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        ports_dir = hca_dir / "ports"
        if not ports_dir.is_dir():
            continue
        for port_dir in sorted(ports_dir.iterdir(), key=lambda p: (len(p.name), p.name)):
            if port_dir.name.isdigit():
                samples.append(read_port(hca_dir, port_dir, clock()))
    return samples
