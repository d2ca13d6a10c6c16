"""Failover of several servers on one PostgreSQL under steady load: kill -9 and SIGSTOP of the
leader, and PostgreSQL restarts.

    .venv/bin/python bench/failover.py [--servers 3] [--rate 20] [--kills 5] [--stops 2] \\
        [--pg-restarts 1] [--lease 3] [--renew 0.5] [--json bench/results/failover.json]

`--servers` real `gpupool up --ha` processes share one throwaway PostgreSQL (pgtemp) and one data
directory, on a simulated pool (`--simulate`, local provider: every pod is a real process, so it
outlives the server that launched it and is re-adopted by the next leader). A load thread submits
`--rate` workloads a second through the SDK with every server's URL (it fails over), each pod
sleeping a few seconds after touching a start marker of its own (WORKLOAD.PID in a shared
directory); one in five is cancelled right after it was acknowledged. Then, one after another,
with `--gap` seconds of steady load between: `--kills` kill -9 of the leader (restarted as a
follower), `--stops` SIGSTOP of the leader for two leases (then SIGCONT), `--pg-restarts`
immediate stops of PostgreSQL, 2 s down.

Measured, from the store and the markers:
- takeover: from the leader's death (or stop) to the new leader's first decision (the first pod
  row written under its epoch), p50 and max; and to the lease being taken;
- acknowledged submissions lost (every 201 id must be in the store), workloads started twice
  (more than one start marker, or more than one pod with a start), cancelled-while-pending workloads
  that ever started (a marker after the cancel), pod rows written under an epoch after the next
  epoch began (a fenced leader's writes);
- API availability: the share of the load's requests answered (the client retries a 503 with
  Retry-After and fails over between URLs), and the steady phase beside the fault phases
  (decisions per second, submit latency) as the side-by-side baseline of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table
from sqlalchemy import create_engine, text

from gpupool.client import Client
from gpupool.errors import GpupoolError
from gpupool.server import pgtemp
from gpupool.server.pgtemp import free_port


@dataclass
class Server:
    data_dir: Path
    log: Path
    env: dict[str, str]
    simulate: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [sys.executable, "-m", "gpupool.cli.main", "up", "--ha", "--data-dir", str(self.data_dir),
                "--port", str(self.port), "--simulate", self.simulate, "--policy", "first-fit"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **self.env}, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-5:]
                raise SystemExit("gpupool up exited (its data directory is removed with the run):\n"
                                 + "\n".join(tail))
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise SystemExit(f"gpupool up did not answer: see {self.log}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Load:
    """Submissions at `rate`/s through one SDK client holding every URL; one in five cancelled."""

    def __init__(self, urls: str, token: str, rate: float, marker_dir: Path, seed: int,
                 gpus: float = 0.125, seconds: tuple[float, float] = (3.0, 8.0)) -> None:
        self.client = Client(urls, token, timeout_s=10, retry_unavailable_s=20)
        self.rate = rate
        self.gpus = gpus
        self.seconds = seconds
        self.markers = marker_dir
        self.rng = random.Random(seed)
        self.acked: list[str] = []
        self.cancelled: dict[str, float] = {}
        """Workloads whose cancel was answered: when it was."""
        self.requests = self.failed = 0
        self.errors: list[str] = []
        self.latency: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.client.close()

    def _run(self) -> None:
        period = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            next_at += period
            sleep_s = self.rng.uniform(*self.seconds)
            marker = f'touch "{self.markers}/$GPUPOOL_WORKLOAD_ID.$$"'
            command = ["sh", "-c", f"{marker}; exec sleep {sleep_s:.1f}"]
            began = time.monotonic()
            self.requests += 1
            try:
                wid = self.client.submit(command=command, gpus=self.gpus)
                self.acked.append(wid)
                self.latency.append((time.time(), time.monotonic() - began))
                if self.rng.random() < 0.2:
                    self.requests += 1
                    answer = self.client.request("POST", f"/workloads/{wid}/cancel")
                    if answer.get("status") == "cancelled":
                        self.cancelled[wid] = time.time()
            except GpupoolError as exc:
                self.failed += 1
                self.errors.append(f"{time.time():.3f} {exc.message}")
            self._stop.wait(max(0.0, next_at - time.monotonic()))


PHASES = ("lease_left", "poll_lag", "wake", "fence", "close", "reopen", "build", "recover", "first_cycle")
"""The parts of a takeover, one after another: the dead leader's lease running out (death to its
expiry), the new leader taking it (expiry to acquired), the new leader's loop starting its
takeover, the takeover's own steps as the new leader logs them (`takeover epoch=N fence_s=...`:
control.py), its first step up to the first pod row."""


def takeover_parts(faults: list[dict[str, Any]], logs: Any) -> None:
    """Adds each fault's phases (PHASES) from the servers' logs and the store's times."""
    done: dict[int, dict[str, float]] = {}
    for path in logs:
        for line in Path(path).read_text(errors="replace").splitlines():
            if " takeover epoch=" not in line:
                continue
            fields = dict(item.split("=", 1) for item in line.split(" takeover ", 1)[1].split())
            done[int(fields.pop("epoch"))] = {k: float(v) for k, v in fields.items()}
    for fault in faults:
        steps = done.get(fault.get("epoch") or -1)
        if steps is None or fault.get("lease_expired_s") is None:
            continue
        fault["lease_left"] = fault["lease_expired_s"]
        fault["poll_lag"] = round(fault["lease_taken_s"] - fault["lease_expired_s"], 3)
        for name in ("fence", "close", "reopen", "build", "recover"):
            fault[name] = steps.get(f"{name}_s")
        own = sum(v for k, v in steps.items() if k.endswith("_s"))
        fault["wake"] = round(steps["done_wall"] - own - (fault["died_wall"] + fault["lease_taken_s"]), 3)
        fault["first_cycle"] = round(fault["first_wall"] - steps["done_wall"], 3)


def renew_latency(servers: list[Server], token: str) -> dict[str, Any]:
    """The lease renewals' wall time from the servers' /metrics (gpupool_lease_renew_seconds, over
    every server alive at the end, since its last start): how many, the mean, and how many took
    longer than 0.25 / 0.5 / 1 s (the margin a lease must leave: a leader stops acting at two
    thirds of it after the start of its last renewal)."""
    count = total = 0.0
    over: dict[str, float] = {"0.25": 0.0, "0.5": 0.0, "1.0": 0.0}
    for server in servers:
        try:
            text_ = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {token}"},
                              timeout=10).text
        except httpx.HTTPError:
            continue
        buckets: dict[str, float] = {}
        for line in text_.splitlines():
            if line.startswith("gpupool_lease_renew_seconds_bucket{"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                buckets[le] = float(line.rsplit(" ", 1)[1])
            elif line.startswith("gpupool_lease_renew_seconds_count"):
                count += float(line.rsplit(" ", 1)[1])
            elif line.startswith("gpupool_lease_renew_seconds_sum"):
                total += float(line.rsplit(" ", 1)[1])
        for le in over:
            over[le] += buckets.get("+Inf", 0.0) - buckets.get(le, 0.0)
    return {"renewals": int(count), "renew_mean_ms": round(1000 * total / count, 1) if count else None,
            **{f"renewals_over_{le}_s": int(n) for le, n in over.items()}}


def cpu_seconds(servers: list[Server], pg_root: Path) -> dict[str, float]:
    """CPU seconds used so far by the servers (their own processes), by PostgreSQL (the postmaster
    under `pg_root` and its backends), by this bench, and by the whole machine (every core, other
    work included: this is a shared machine), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")

    def stat(pid: int) -> tuple[int, float]:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / tick  # ppid, utime + stime

    parts = {"servers": 0.0, "postgres": 0.0}
    ours = {s.proc.pid for s in servers if s.proc is not None and s.proc.poll() is None}
    postmaster = None
    table: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            table[int(entry.name)] = stat(int(entry.name))
            if postmaster is None and str(pg_root) in (entry / "cmdline").read_text(errors="replace"):
                postmaster = int(entry.name)
        except (OSError, ValueError, IndexError):
            continue
    for pid, (ppid, used) in table.items():
        if pid in ours:
            parts["servers"] += used
        elif postmaster is not None and (pid == postmaster or ppid == postmaster):
            parts["postgres"] += used
    usage = resource.getrusage(resource.RUSAGE_SELF)
    parts["bench"] = usage.ru_utime + usage.ru_stime
    cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    parts["machine"] = (sum(int(v) for v in cpu) - int(cpu[3]) - int(cpu[4])) / tick  # all but idle, iowait
    return parts


def running_max(intervals: list[Any]) -> int:
    """The most pods running at once, from their started/finished times."""
    events = sorted([(float(a), 1) for a, _ in intervals] +
                    [(float(b), -1) for _, b in intervals if b is not None])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--simulate", default="2x8xH100")
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--pod-gpus", type=float, default=0.125,
                        help="each pod's GPU fraction (smaller: more pods run at once on the pool)")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--stops", type=int, default=2)
    parser.add_argument("--pg-restarts", type=int, default=1)
    parser.add_argument("--pod-seconds", default="3,8",
                        help="each pod sleeps a uniform time in MIN,MAX seconds (longer: more run at once)")
    parser.add_argument("--netns", choices=("auto", "on", "off"), default="auto",
                        help="GPUPOOL_POD_NETNS for the servers (a network namespace per pod, or none)")
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--renew", type=float, default=0.5)
    parser.add_argument("--gap", type=float, default=8.0, help="seconds of steady load between faults")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("bench/results/failover.json"))
    parser.add_argument("--logs", type=Path, default=None, help="copy the servers' logs here at the end")
    args = parser.parse_args()
    reason = pgtemp.why_unavailable()
    if reason:
        raise SystemExit(f"needs PostgreSQL: {reason}")
    pg = pgtemp.start(fsync=True)  # durable commits: an immediate stop must lose no acknowledged one
    root = Path(tempfile.mkdtemp(prefix="gpupool-failover-"))
    os.chmod(root, 0o711)  # the pods' accounts reach their marker directory below
    markers = root / "markers"
    markers.mkdir()
    os.chmod(markers, 0o1777)  # the pods' accounts write their start markers here
    servers: list[Server] = []
    engine = None
    load: Load | None = None
    try:
        url = pg.create_database()
        engine = create_engine(url, pool_pre_ping=True)
        env = {"GPUPOOL_DATABASE_URL": url, "GPUPOOL_LEASE_S": str(args.lease),
               "GPUPOOL_LEASE_RENEW_S": str(args.renew), "GPUPOOL_POD_NETNS": args.netns}
        for i in range(args.servers):
            server = Server(root / "data", root / f"server{i}.log", env, args.simulate)
            server.start()
            servers.append(server)
        token = (root / "data" / "admin-token").read_text().strip()

        def sql(query: str, **params: Any) -> list[Any]:
            for _ in range(100):
                try:
                    with engine.connect() as conn:
                        return list(conn.execute(text(query), params))
                except Exception:  # the store restarting: again
                    time.sleep(0.2)
            raise SystemExit("the store did not answer")

        def lease() -> tuple[str, int, float]:
            rows = sql("SELECT holder, epoch, acquired_s FROM leader_lease")
            return (rows[0][0], int(rows[0][1]), float(rows[0][2])) if rows else ("", 0, 0.0)

        def expiry(epoch: int) -> float | None:
            rows = sql("SELECT expires_s FROM leader_lease WHERE epoch = :e", e=epoch)
            return float(rows[0][0]) if rows else None

        def leader() -> Server:
            holder = lease()[0]
            (address,), = sql("SELECT address FROM servers WHERE id = :i", i=holder)
            port = int(str(address).rsplit(":", 1)[1])
            return next(s for s in servers if s.port == port)

        while lease()[1] == 0:
            time.sleep(0.1)
        low, _, high = args.pod_seconds.partition(",")
        load = Load(",".join(s.url for s in servers), token, args.rate, markers, args.seed, args.pod_gpus,
                    (float(low), float(high or low)))
        load.start()
        time.sleep(args.gap)
        steady_from = time.time()
        cpu_from, acked_from = cpu_seconds(servers, pg.root), len(load.acked)
        time.sleep(args.gap)
        steady_to = time.time()
        cpu_to, acked_to = cpu_seconds(servers, pg.root), len(load.acked)
        steady_acked = max(1, acked_to - acked_from)
        cpu_use = {f"steady_cpu_{part}_ms_per_submission": round(1000 * (cpu_to[part] - cpu_from[part])
                                                                  / steady_acked, 2) for part in cpu_to}
        cpu_use["steady_machine_busy_cores"] = round((cpu_to["machine"] - cpu_from["machine"])
                                                     / (steady_to - steady_from), 2)
        cpu_use["load_average_1m_at_steady"] = round(os.getloadavg()[0], 1)
        faults: list[dict[str, Any]] = []

        def await_takeover(kind: str, died_at: float, epoch: int) -> dict[str, Any]:
            deadline = time.monotonic() + 60
            expires: float | None = None
            while time.monotonic() < deadline:
                _, now_epoch, acquired = lease()
                if now_epoch == epoch:  # the dead leader's last expiry (it renews no more)
                    expires = expiry(epoch) or expires
                first = sql("SELECT min(created_s) FROM pods WHERE epoch = :e", e=now_epoch)[0][0] \
                    if now_epoch > epoch else None
                if first is not None:
                    return {"kind": kind, "epoch": now_epoch,
                            "lease_expired_s": round(expires - died_at, 3) if expires else None,
                            "lease_taken_s": round(acquired - died_at, 3),
                            "first_decision_s": round(float(first) - died_at, 3), "died_wall": died_at,
                            "first_wall": float(first)}
                time.sleep(0.05)
            return {"kind": kind, "epoch": None, "lease_taken_s": None, "first_decision_s": None}

        plan = ["kill"] * args.kills + ["stop"] * args.stops + ["pg"] * args.pg_restarts
        for kind in plan:
            if kind == "pg":
                began = time.time()
                pg.halt()
                time.sleep(2.0)
                pg.resume()
                faults.append({"kind": "pg-restart", "down_s": round(time.time() - began, 3)})
            else:
                victim = leader()
                _, epoch, _ = lease()
                assert victim.proc is not None
                died = time.time()
                if kind == "kill":
                    victim.proc.send_signal(signal.SIGKILL)
                    victim.proc.wait(30)
                    faults.append(await_takeover("kill -9", died, epoch))
                    victim.start()  # back as a follower
                else:
                    os.kill(victim.proc.pid, signal.SIGSTOP)
                    faults.append(await_takeover("SIGSTOP", died, epoch))
                    time.sleep(max(0.0, died + 2 * args.lease - time.time()))
                    os.kill(victim.proc.pid, signal.SIGCONT)
            time.sleep(args.gap)
        load.stop()
        renew = renew_latency([s for s in servers if s.alive()], token)
        time.sleep(args.lease + 10 + float(high or low))  # the last pods end and are recorded

        # ---- the counts, from the store and the markers
        acked = load.acked
        stored = {r[0] for r in sql("SELECT id FROM workloads")}
        lost = [w for w in acked if w not in stored]
        marks: dict[str, list[float]] = {}
        for path in markers.iterdir():
            wid = path.name.rsplit(".", 1)[0]
            marks.setdefault(wid, []).append(path.stat().st_mtime)
        twice_markers = sorted(w for w, m in marks.items() if len(m) > 1)
        twice_pods = [r[0] for r in sql(
            "SELECT workload_id FROM pods WHERE started_s IS NOT NULL GROUP BY workload_id "
            "HAVING count(*) > 1")]
        # a cancelled workload admitted after its cancel was answered, or started with no pod row at all
        created: dict[str, list[float]] = {}
        for wid, at in sql("SELECT workload_id, created_s FROM pods"):
            created.setdefault(wid, []).append(float(at))
        cancelled_started = sorted(
            w for w, at in load.cancelled.items()
            if any(c > at for c in created.get(w, [])) or (w in marks and w not in created))
        epochs = sql("SELECT epoch, acquired_s FROM leader_lease")
        # pods written under an epoch after the next epoch's first decision (a fenced leader's writes)
        fenced_rows = 0
        starts = sql("SELECT epoch, min(created_s) FROM pods WHERE epoch IS NOT NULL GROUP BY epoch")
        began_at = {int(e): float(t) for e, t in starts}
        for e in began_at:
            later = [began_at[n] for n in began_at if n > e]
            if later:
                fenced_rows += int(sql("SELECT count(*) FROM pods WHERE epoch = :e AND created_s > :t",
                                       e=e, t=min(later))[0][0])
        decisions = sql("SELECT created_s FROM pods")
        steady_rate = sum(1 for (c,) in decisions if steady_from <= c < steady_to) / (steady_to - steady_from)
        takeover_parts(faults, root.glob("server*.log"))
        takeovers = [f["first_decision_s"] for f in faults if f.get("first_decision_s") is not None]
        leases = [f["lease_taken_s"] for f in faults if f.get("lease_taken_s") is not None]

        def p50(key: str) -> float | None:
            values = [f[key] for f in faults if f.get(key) is not None]
            return round(statistics.median(values), 3) if values else None
        steady_lat = [lat for at, lat in load.latency if steady_from <= at < steady_to]
        all_lat = [lat for _, lat in load.latency]
        result = {
            "servers": args.servers, "simulate": args.simulate, "rate_per_s": args.rate,
            "pod_gpus": args.pod_gpus, "pod_seconds": args.pod_seconds, "netns": args.netns, **cpu_use,
            "running_pods_max": running_max(sql("SELECT started_s, finished_s FROM pods "
                                                "WHERE started_s IS NOT NULL")),
            "lease_s": args.lease, "renew_s": args.renew, "faults": faults,
            "takeover_first_decision_p50_s": statistics.median(takeovers) if takeovers else None,
            "takeover_first_decision_max_s": max(takeovers) if takeovers else None,
            "lease_taken_p50_s": statistics.median(leases) if leases else None,
            **renew,
            **{f"phase_{name}_p50_s": p50(name) for name in PHASES},
            "takeovers_missing": sum(1 for f in faults if "epoch" in f and f["epoch"] is None),
            "acknowledged": len(acked), "acknowledged_lost": len(lost),
            "started_twice_markers": len(twice_markers), "started_twice_pods": len(twice_pods),
            "cancelled": len(load.cancelled), "cancelled_started": len(cancelled_started),
            "fenced_leader_rows": fenced_rows, "epochs": len(began_at), "final_epoch": int(epochs[0][0]),
            "requests": load.requests, "requests_failed": load.failed,
            "availability": 1 - load.failed / max(1, load.requests),
            "steady_decisions_per_s": round(steady_rate, 2),
            "submit_latency_steady_p50_ms": round(1000 * pct(steady_lat, 0.5), 1),
            "submit_latency_all_p99_ms": round(1000 * pct(all_lat, 0.99), 1),
            "submit_latency_all_max_ms": round(1000 * max(all_lat, default=0.0), 1),
            "markers": sum(len(m) for m in marks.values()),
            "errors": load.errors[:10],
            "servers_alive_at_end": sum(s.alive() for s in servers),
        }
        table = Table(title=f"failover: {args.servers} servers, {args.simulate}, {args.rate:g} "
                            f"submissions/s, lease {args.lease:g} s / renew {args.renew:g} s")
        table.add_column("measure")
        table.add_column("value", justify="right")
        for key, value in result.items():
            if key not in ("faults", "errors"):
                table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
        Console().print(table)
        phases = Table(title="where the time from the leader's death to the new leader's first decision "
                             "went (s), per takeover")
        timed = [f for f in faults if f.get("first_decision_s") is not None]
        shown = timed if len(timed) <= 8 else []  # more: only the summary columns fit a terminal
        phases.add_column("phase")
        for fault in shown:
            phases.add_column(f"{'kill' if fault['kind'] == 'kill -9' else 'stop'} {fault['epoch']}",
                              justify="right")
        for column in ("min", "p50", "max"):
            phases.add_column(column, justify="right")
        for name in (*PHASES, "first_decision_s"):
            values = [f[name] for f in timed if f.get(name) is not None]
            cells = ["-" if f.get(name) is None else f"{f[name]:.2f}" for f in shown]
            middle = p50(name)
            summary = [f"{min(values):.2f}", "-" if middle is None else f"{middle:.2f}",
                       f"{max(values):.2f}"] if values else ["-", "-", "-"]
            phases.add_row(name.removesuffix("_s"), *cells, *summary)
        Console().print(phases)
        for fault in faults:
            print({k: v for k, v in fault.items() if not k.endswith("_wall")})
        for error in load.errors[:10]:
            print("failed request:", error)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    finally:
        if load is not None and not load._stop.is_set():
            load.stop()
        if servers:
            try:
                admin = (root / "data" / "admin-token").read_text().strip()
                with Client(",".join(s.url for s in servers), admin, timeout_s=10) as pool:
                    for wid in pool.workload_ids(status=["running", "pending", "admitted"]):
                        pool.request("POST", f"/workloads/{wid}/cancel")
            except (GpupoolError, OSError):
                pass
        for server in servers:
            if server.proc is not None and server.proc.poll() is None:
                server.proc.send_signal(signal.SIGCONT)
                server.proc.terminate()
                try:
                    server.proc.wait(30)
                except subprocess.TimeoutExpired:
                    server.proc.kill()
        if engine is not None:
            engine.dispose()
        pg.stop()
        if args.logs is not None:
            args.logs.mkdir(parents=True, exist_ok=True)
            for log in root.glob("server*.log"):
                shutil.copy(log, args.logs / log.name)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
