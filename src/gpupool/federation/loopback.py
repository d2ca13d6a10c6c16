"""A federation on loopback for tests and bench/federation.py: member pools (`gpupool up --provider
fake`, SQLite each, their own data directories) and a hub (`gpupool up --federation`), each its own
process, so a member can be killed (SIGKILL) and started again on its store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from gpupool.server.pgtemp import free_port

ALICE = "alice"
"""The tenant the loopback federation creates on the hub and on every member."""


class Process(Protocol):
    """What the federation needs of a started server: `subprocess.Popen`'s pid, poll and wait."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


Spawn = Callable[[list[str], dict[str, str], Path], Process]
"""Starts `gpupool ARGV` with exactly the environment given, stdout and stderr appended to the log
file given, in a session of its own."""


def popen_gpupool(argv: list[str], env: dict[str, str], log: Path) -> Process:
    """`Spawn` as a new interpreter (the default; the tests hand a fork server's)."""
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", *argv], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                env=env)


@dataclass
class Proc:
    name: str
    port: int
    data_dir: Path
    args: list[str]
    log: Path
    process: Process | None = None
    spawn: Spawn = popen_gpupool

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = ["up", "--data-dir", str(self.data_dir), "--port", str(self.port), *self.args]
        self.process = self.spawn(argv, {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")},
                                  self.log)

    def kill(self) -> None:
        """SIGKILL: the member dies with whatever it held (its pods are fake, so they die with it)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def admin(self, source: str | None = None) -> httpx.Client:
        """The admin API; from `source` (e.g. 127.0.0.3), past `cut_link`, which rejects 127.0.0.1."""
        token = (self.data_dir / "admin-token").read_text().strip()
        return httpx.Client(base_url=self.url + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                            timeout=10,
                            transport=httpx.HTTPTransport(local_address=source) if source else None)

    def wait_up(self, timeout_s: float = 60.0) -> None:
        until(lambda: httpx.get(self.url + "/health", timeout=1).status_code == 200, timeout_s,
              f"{self.name} did not start (see {self.log})", self)


UNCUT = "127.0.0.3"
"""The address tests and benches read a member from while `cut_link` keeps the hub away from it."""


def cut_link(port: int, cut: bool) -> None:
    """Reject (TCP reset) or allow again connections from 127.0.0.1 to `port`: the hub's link to a
    member, both left running (a partition). Root and iptables only."""
    subprocess.run(["iptables", "-I" if cut else "-D", "INPUT", "-p", "tcp", "-s", "127.0.0.1",
                    "-d", "127.0.0.1", "--dport", str(port), "-j", "REJECT", "--reject-with", "tcp-reset"],
                   check=True)


def until(predicate: Callable[[], Any], timeout_s: float, what: str, proc: Proc | None = None) -> Any:
    """Poll `predicate` until it is truthy (a transport error counts as not yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
            if value:
                return value
        except httpx.TransportError:
            pass
        if proc is not None and proc.process is not None and proc.process.poll() is not None:
            raise AssertionError(f"{what}: it exited with {proc.process.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.05)


@dataclass
class Federation:
    root: Path
    members: list[Proc] = field(default_factory=list)
    hub: Proc | None = None
    alice_token: str = ""
    hub_output: str = ""
    tokens: dict[str, str] = field(default_factory=dict)
    """Tenant -> its token at the hub, for the tenants beyond alice."""

    def member(self, name: str) -> Proc:
        return next(m for m in self.members if m.name == name)

    def hub_api(self, token: str | None = None) -> httpx.Client:
        assert self.hub is not None
        return httpx.Client(base_url=self.hub.url + "/api/v1", timeout=10,
                            headers={"Authorization": f"Bearer {token or self.alice_token}"})

    def stop(self) -> None:
        for proc in [*((self.hub and [self.hub]) or []), *self.members]:
            proc.stop()


def start_federation(root: Path, names: tuple[str, ...] = ("east", "west", "north"), *,
                     simulate: str = "1x4xH100", ghost: bool = False, down_after_s: float = 2.0,
                     grace_s: float = 1.0, poll_s: float = 0.25, policy: str = "home",
                     regions: tuple[str, ...] = (), tenants: dict[str, str] | None = None,
                     datasets: dict[str, tuple[float, str]] | None = None,
                     provider: str = "fake", fence_s: float | None = None,
                     free_port: Callable[[], int] = free_port, spawn: Spawn = popen_gpupool) -> Federation:
    """Members `names` (alice's home: the first; member i's GPU-hour at 1.0 - 0.1 i) and a hub over
    them; with `ghost`, one more member whose URL nothing answers (the hub starts anyway and says so).
    `tenants`: more tenants (home: the first member) -> their own policy; `datasets`: name -> (size in
    GB, the member holding it); `provider`: the members' (local: their pods are real processes);
    `fence_s`: the members' federation.fence; `free_port`: where each server's port comes from (the
    tests hand their own: a port-0 bind closed again may be taken before the server binds it);
    `spawn`: how each server is started (a member started again after a kill too)."""
    fed = Federation(root)
    try:
        _start(fed, names, simulate, ghost, down_after_s, grace_s, poll_s, policy, regions, tenants or {},
               datasets or {}, provider, fence_s, free_port, spawn)
    except BaseException:
        fed.stop()
        raise
    return fed


def _start(fed: Federation, names: tuple[str, ...], simulate: str, ghost: bool, down_after_s: float,
           grace_s: float, poll_s: float, policy: str, regions: tuple[str, ...], tenants: dict[str, str],
           datasets: dict[str, tuple[float, str]], provider: str = "fake",
           fence_s: float | None = None, free_port: Callable[[], int] = free_port,
           spawn: Spawn = popen_gpupool) -> None:
    root = fed.root
    pool_config: list[str] = []
    if fence_s is not None:
        (root / "member.yaml").write_text(f"federation:\n  fence: {fence_s:g}\n")
        pool_config = ["--config", str(root / "member.yaml")]
    for name in names:
        data = root / name
        data.mkdir(mode=0o700, parents=True)
        fed.members.append(Proc(name, free_port(), data, ["--provider", provider, "--simulate", simulate,
                                                          "--placement", "first-fit", *pool_config],
                                root / f"{name}.log", spawn=spawn))
    for proc in fed.members:
        proc.start()
    lines = [f"policy: {policy}", f"member_down_after_s: {down_after_s}", f"requeue_grace_s: {grace_s}",
             f"poll_interval_s: {poll_s}", f"offer_timeout_s: {max(1.0, 4 * poll_s)}", "members:"]
    for index, proc in enumerate(fed.members):
        proc.wait_up()
        with proc.admin() as api:
            for tenant in (ALICE, *tenants):
                assert api.post("/tenants", json={"name": tenant}).status_code == 201
            made = api.post("/tokens", json={"tenant": None, "name": "hub", "scope": "federation",
                                              "never_expires": True})
            assert made.status_code == 201, made.text
        token_file = root / f"{proc.name}.token"
        token_file.write_text(made.json()["token"])
        token_file.chmod(0o600)
        region = regions[index] if index < len(regions) else proc.name
        lines += [f"  - name: {proc.name}", f"    url: {proc.url}", f"    token_file: {token_file.name}",
                  f"    region: {region}", f"    prices: {{gpu_hour: {1.0 - 0.1 * index:g}}}",
                  f"    datasets: [{', '.join(d for d, (_, m) in datasets.items() if m == proc.name)}]"]
    if ghost:
        ghost_token = root / "ghost.token"
        ghost_token.write_text("gp_nothing-answers-here")
        ghost_token.chmod(0o600)
        lines += ["  - name: ghost", f"    url: http://127.0.0.1:{free_port()}",
                  "    token_file: ghost.token", "    region: ghost"]
    lines += ["tenants:", f"  {ALICE}: {{home: {names[0]}}}",
              *(f"  {t}: {{home: {names[0]}, policy: {p}}}" for t, p in tenants.items())]
    if datasets:
        lines += ["datasets:", *(f"  {d}: {{size_gb: {gb:g}}}" for d, (gb, _) in datasets.items())]
    (root / "fed.yaml").write_text("\n".join(lines) + "\n")
    hub_dir = root / "hub"
    hub_dir.mkdir(mode=0o700)
    fed.hub = Proc("hub", free_port(), hub_dir, ["--federation", str(root / "fed.yaml")], root / "hub.log",
                   spawn=spawn)
    fed.hub.start()
    fed.hub.wait_up()
    with fed.hub.admin() as api:
        assert api.post("/tenants", json={"name": ALICE}).status_code == 201
        fed.alice_token = api.post("/tokens", json={"tenant": ALICE, "name": "alice"}).json()["token"]
        for tenant in tenants:
            assert api.post("/tenants", json={"name": tenant}).status_code == 201
            fed.tokens[tenant] = api.post("/tokens", json={"tenant": tenant, "name": tenant}).json()["token"]
    fed.hub_output = fed.hub.log.read_text()


def copies(proc: Proc, active_only: bool = True,
           source: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """A member's copies of hub workloads, by the hub's id (read with the member's admin token)."""
    from gpupool.federation.hub import FEDERATION_ID_ENV

    params: dict[str, Any] = {"full": "true", "limit": 1000}
    if active_only:
        params["status"] = ["pending", "admitted", "running"]
    with proc.admin(source) as api:
        items = api.get("/workloads", params=params).json()["items"]
    out: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        fed_id = item["spec"]["env"].get(FEDERATION_ID_ENV)
        if fed_id:
            out.setdefault(fed_id, []).append(item)
    return out
