"""Run the real IB tools (ibnetdiscover, perfquery, ibtracert, opensm), optionally on an ibsim fabric."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.errors import Unavailable

UMAD2SIM_GLOBS = (
    "/usr/lib/*/umad2sim/libumad2sim.so",
    "/usr/lib64/umad2sim/libumad2sim.so",
    "/usr/lib/umad2sim/libumad2sim.so",
    "/usr/local/lib/umad2sim/libumad2sim.so",
)
TOOLS = ("ibsim", "ibnetdiscover", "opensm", "perfquery", "ibtracert")


def find_umad2sim() -> Path | None:
    for pattern in UMAD2SIM_GLOBS:
        hits = sorted(glob.glob(pattern))
        if hits:
            return Path(hits[0])
    return None


def find_tool(name: str) -> str | None:
    """The tool's path; also looks in /usr/sbin, where Debian installs the diagnostics."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/local/sbin")


def missing_tools(names: Sequence[str] = TOOLS) -> list[str]:
    """Tools (and the umad2sim library) that are not installed."""
    missing = [name for name in names if find_tool(name) is None]
    if find_umad2sim() is None:
        missing.append("libumad2sim.so")
    return missing


@dataclass
class IbSim:
    """An ibsim process serving one fabric on a private socket name, stopped by its PID.

    Use as a context manager. Tools started with `run()` see that fabric through umad2sim.
    """

    netfile: Path
    workdir: Path
    max_nodes: int = 0
    max_switches: int = 0
    max_ports: int = 0
    ready_timeout_s: float = 120.0
    socket_name: str = ""
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.socket_name = self.socket_name or f"gpupool-ibsim-{os.getpid()}-{id(self) & 0xFFFFFF:x}"
        self.log_path = self.workdir / "ibsim.log"

    def env(self) -> dict[str, str]:
        library = find_umad2sim()
        if library is None:
            raise Unavailable("libumad2sim.so is missing; install Debian's ibsim-utils.")
        env = dict(os.environ)
        env["IBSIM_SOCKNAME"] = self.socket_name
        env["LD_PRELOAD"] = str(library)  # set directly: ibsim-run mangles an LD_PRELOAD already set
        env["OSM_CACHE_DIR"] = str(self.workdir / "opensm-cache")
        env["OSM_TMP_DIR"] = str(self.workdir)
        return env

    def start(self) -> IbSim:
        ibsim = find_tool("ibsim")
        if ibsim is None:
            raise Unavailable("ibsim is not installed; install Debian's ibsim-utils.")
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "opensm-cache").mkdir(exist_ok=True)
        cmd = [ibsim, "-s", "-n"]
        for flag, value in (("-N", self.max_nodes), ("-S", self.max_switches), ("-P", self.max_ports)):
            if value:
                cmd += [flag, str(value)]
        cmd.append(str(self.netfile))
        env = dict(os.environ, IBSIM_SOCKNAME=self.socket_name)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                cmd, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            if "simulator ready" in text:
                return
            if self.process is not None and self.process.poll() is not None:
                self.stop()
                raise Unavailable(f"ibsim exited while loading {self.netfile.name}: {text[-300:]}")
            time.sleep(0.05)
        self.stop()
        raise Unavailable(f"ibsim did not get ready within {self.ready_timeout_s:.0f} s.")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> IbSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self, args: Sequence[str], timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run a tool against the simulated fabric; its output is returned, not raised on."""
        tool = find_tool(args[0]) or args[0]
        return subprocess.run(
            [tool, *args[1:]], cwd=self.workdir, env=self.env(), capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )

    def opensm_once(
        self, extra: Sequence[str] = (), routing: str = "updn", timeout_s: float = 600.0,
        debug_flags: str = "0x07",
    ) -> OpenSmRun:
        """Run OpenSM once (-o) with `routing`; read its routing time from its own log."""
        log = self.workdir / f"opensm-{routing}-{time.monotonic_ns()}.log"
        started = time.monotonic()
        done = self.run(
            ["opensm", "-o", "-R", routing, "-f", str(log), "-D", debug_flags, *extra], timeout_s
        )
        wall_s = time.monotonic() - started
        text = log.read_text(errors="replace") if log.exists() else ""
        return OpenSmRun(done.returncode, wall_s, routing_seconds(text, routing), text, done.stdout)


@dataclass(frozen=True)
class OpenSmRun:
    returncode: int
    wall_s: float
    routing_s: float | None
    log: str
    stdout: str

    @property
    def subnet_up(self) -> bool:
        return "SUBNET UP" in self.log


_STAMP = re.compile(r"^\w{3}\s+\d+\s+(\d\d):(\d\d):(\d\d)\s+(\d{6})")


def _stamp_s(line: str) -> float | None:
    match = _STAMP.match(line)
    if not match:
        return None
    h, m, s, us = (int(g) for g in match.groups())
    return h * 3600 + m * 60 + s + us / 1e6


def routing_seconds(log: str, routing: str) -> float | None:
    """Seconds from "building routing with '<engine>'" to "<engine> tables configured" in a log."""
    start = end = None
    for line in log.splitlines():
        if start is None and f"building routing with '{routing}'" in line:
            start = _stamp_s(line)
        elif start is not None and f"{routing} tables configured" in line:
            end = _stamp_s(line)
            break
    if start is None or end is None:
        return None
    return end - start if end >= start else end + 86400 - start


_TRACE_HOP = re.compile(r"^\[(\d+)\]\s*->\s*(switch|ca)")


def ibtracert_hops(output: str) -> int:
    """Links on an ibtracert path: one per '[port] -> ...' line."""
    return sum(1 for line in output.splitlines() if _TRACE_HOP.match(line.strip()))
