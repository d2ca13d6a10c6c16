"""The services' data plane under load: what the router adds, and how fast the pool follows a load step.

Part 1, the router (side by side, alternating rounds): a small asyncio HTTP app as the replica; an
open-loop client at a fixed rate (default 1,000 req/s) straight to the replica, through HAProxy and
through the in-process router, round after round in turn; then a closed-loop client at full speed
for the throughput. Reported: p50/p99 latency per path, added p50/p99 (router minus direct, medians
of the rounds' figures), and requests per second.

Part 2, the pool (`gpupool up --simulate 1x4xH100 --serve-port`): a tenant's service at zero replicas
with a target concurrency of 2; a burst of requests while it is at zero (all must be answered: none
dropped; the cold start is the first answer's wait), then a load step to 16 closed-loop clients (the
replica takes 50 ms a request): the time from the step to the autoscaler's scale event and to the
new ready replica, against the replica's own readiness time (its scale event to ready).

  .venv/bin/python bench/serve_load.py                     # both parts, about 2 minutes
  .venv/bin/python bench/serve_load.py --part router --rounds 5 --seconds 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpupool.server.dataplane.haproxy import find_haproxy  # noqa: E402
from gpupool.server.dataplane.model import Backend, Probe, Route  # noqa: E402
from gpupool.server.dataplane.plane import DataPlane  # noqa: E402
from gpupool.server.pgtemp import free_port  # noqa: E402

RESULTS = ROOT / "bench" / "results"
REPLICA = r"""
import asyncio, os, sys
port = int(os.environ['PORT'])
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b'\r\n\r\n')
            line = head.split(b'\r\n', 1)[0]
            if b'/work' in line:
                await asyncio.sleep(0.05)
            body = b'ok'
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\n' + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()
async def main():
    server = await asyncio.start_server(handle, '0.0.0.0', port, backlog=1024)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""


# ------------------------------------------------------------------ a small HTTP/1.1 keep-alive client
class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> None:
        self.reader, self.writer, self.request = reader, writer, request

    @classmethod
    async def open(cls, port: int, path: str, token: str | None) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        request = f"GET {path} HTTP/1.1\r\nHost: bench\r\n{auth}\r\n".encode()
        return cls(reader, writer, request)

    async def get(self) -> int:
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        if length:
            await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.writer.close()


async def open_loop(port: int, path: str, token: str | None, rate: float, seconds: float,
                    conns: int = 64) -> dict[str, float]:
    """Requests sent on a fixed schedule (not waiting for answers), latency from the scheduled time."""
    pool = [await Conn.open(port, path, token) for _ in range(conns)]
    free: asyncio.Queue[Conn] = asyncio.Queue()
    for c in pool:
        free.put_nowait(c)
    latencies: list[float] = []
    errors = 0
    start = time.perf_counter()
    total = int(rate * seconds)

    async def one(at: float) -> None:
        nonlocal errors
        conn = await free.get()
        try:
            status = await conn.get()
            if status != 200:
                errors += 1
            latencies.append((time.perf_counter() - at) * 1000)
        finally:
            free.put_nowait(conn)

    tasks = []
    for i in range(total):
        at = start + i / rate
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(at)))
    await asyncio.gather(*tasks)
    for c in pool:
        c.close()
    latencies.sort()
    return {"p50_ms": latencies[len(latencies) // 2], "p99_ms": latencies[int(len(latencies) * 0.99)],
            "sent_per_s": total / (time.perf_counter() - start), "errors": errors}


async def closed_loop(port: int, path: str, token: str | None, seconds: float, conns: int = 32) -> float:
    pool = [await Conn.open(port, path, token) for _ in range(conns)]
    done = 0
    end = time.perf_counter() + seconds

    async def worker(c: Conn) -> None:
        nonlocal done
        while time.perf_counter() < end:
            await c.get()
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in pool))
    for c in pool:
        c.close()
    return done / (time.perf_counter() - start)


# ------------------------------------------------------------------ part 1: the router beside direct
def part_router(rounds: int, seconds: float, rate: float) -> dict[str, object]:
    replica_port = free_port()
    replica = subprocess.Popen([sys.executable, "-c", REPLICA], env={**os.environ, "PORT": str(replica_port)})
    planes: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="serve-load-"))
    try:
        wait_port(replica_port)
        for name in ("haproxy", "in-process"):
            if name == "haproxy" and find_haproxy() is None:
                print("haproxy is not installed: only the in-process router is measured")
                continue
            port = free_port()  # each router in a process of its own, as in the pool (not this client's)
            argv = [sys.executable, __file__, "--serve-plane", name, "--plane-port", str(port),
                    "--replica-port", str(replica_port), "--plane-dir", str(tmp / name)]
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE)
            planes[name] = (proc, port)
            wait_port(port)
        paths = {"direct": (replica_port, "/x", None),
                 **{name: (port, "/s/bench/echo/x", TOKEN) for name, (_, port) in planes.items()}}
        per_round: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
        for _ in range(rounds):
            for name, (port, path, tok) in paths.items():
                per_round[name].append(asyncio.run(open_loop(port, path, tok, rate, seconds)))
        throughput = {name: asyncio.run(closed_loop(port, path, tok, seconds)) for name, (port, path, tok)
                      in paths.items()}
    finally:
        for proc, _ in planes.values():
            assert proc.stdin is not None
            proc.stdin.close()  # the router process stops when its stdin closes
            proc.wait(timeout=30)
        replica.terminate()
        replica.wait()
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("p50_ms", "p99_ms")}
           for name, rs in per_round.items()}
    out: dict[str, object] = {"rate": rate, "rounds": rounds, "seconds": seconds, "medians": med,
                              "rounds_detail": per_round, "throughput_per_s": throughput}
    added = {name: {"p50_ms": med[name]["p50_ms"] - med["direct"]["p50_ms"],
                    "p99_ms": med[name]["p99_ms"] - med["direct"]["p99_ms"]} for name in planes}
    out["added"] = added
    print(f"\nrouter at {rate:g} req/s, {rounds} alternating rounds of {seconds:g} s (medians):")
    print(f"{'path':12} {'p50 ms':>8} {'p99 ms':>8} {'added p50':>10} {'added p99':>10} {'max req/s':>10} "
          f"{'ratio':>6}")
    for name in paths:
        a = added.get(name, {"p50_ms": 0.0, "p99_ms": 0.0})
        print(f"{name:12} {med[name]['p50_ms']:8.3f} {med[name]['p99_ms']:8.3f} {a['p50_ms']:10.3f} "
              f"{a['p99_ms']:10.3f} {throughput[name]:10.0f} {throughput[name] / throughput['direct']:6.2f}")
    return out


TOKEN = "gp_benchtoken"
STEP_CLIENTS = 16
"""Closed-loop clients of the load step (each request takes the replica 50 ms): a Python client on a
loaded machine keeps fewer in flight than it has clients, so there are more clients than the target
needs."""


def serve_plane(kind: str, port: int, replica_port: int, directory: Path) -> None:
    """One router routing bench/echo to the replica, until stdin closes."""
    import hashlib

    plane = DataPlane(directory, "127.0.0.1", port, haproxy=find_haproxy() if kind == "haproxy" else None)
    plane.start()
    plane.set_routes([Route("bench/echo", "bench", probe=Probe(path=None))])
    plane.set_backends("bench/echo", [Backend("echo-0", "127.0.0.1", replica_port)])
    plane.set_tokens({hashlib.sha256(TOKEN.encode()).hexdigest(): "bench"})
    try:
        sys.stdin.read()
    finally:
        plane.stop()


def wait_port(port: int, timeout_s: float = 20.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


# ------------------------------------------------------------------ part 2: through the simulated pool
def part_pool(burst: int) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="serve-pool-"))
    api_port, serve_port = free_port(), free_port()
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 (open while the server runs)
    env = {**os.environ, "GPUPOOL_POD_NETWORK": "10.247.0.0/16"}
    argv = [sys.executable, "-m", "gpupool.cli.main", "up", "--data-dir", str(tmp / "data"),
            "--port", str(api_port), "--simulate", "1x4xH100", "--serve-port", str(serve_port),
            "--serve-cold-start", "120"]
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    api = f"http://127.0.0.1:{api_port}/api/v1"
    try:
        until(lambda: httpx.get(f"{api}/health", timeout=2).status_code == 200, 90)
        admin = {"Authorization": f"Bearer {(tmp / 'data' / 'admin-token').read_text().strip()}"}
        httpx.post(f"{api}/tenants", json={"name": "bench"}, headers=admin, timeout=30).raise_for_status()
        made = httpx.post(f"{api}/tokens", json={"tenant": "bench"}, headers=admin, timeout=30)
        made.raise_for_status()
        token = made.json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        spec = {"name": "echo", "command": ["python3", "-c", REPLICA], "min_replicas": 0, "max_replicas": 4,
                "target_concurrency": 2, "resources": {"gpus": 0.25},
                "readiness": {"kind": "http", "path": "/", "period_s": 0.2, "timeout_s": 0.2}}
        httpx.post(f"{api}/services", json=spec, headers=auth, timeout=30).raise_for_status()
        base = f"http://127.0.0.1:{serve_port}/s/bench/echo"
        # routed once the data plane's loop has seen the service: a request without a token gets 401
        until(lambda: httpx.get(f"{base}/", timeout=5).status_code == 401, 30)

        async def burst_from_zero() -> tuple[list[int], float, float]:
            async with httpx.AsyncClient(timeout=150, headers=auth) as client:
                t0 = time.perf_counter()
                first: list[float] = []

                async def one() -> int:
                    r = await client.get(f"{base}/")
                    first.append(time.perf_counter() - t0)
                    return r.status_code

                codes = await asyncio.gather(*(one() for _ in range(burst)))
                return list(codes), min(first), max(first)

        codes, first_s, last_s = asyncio.run(burst_from_zero())
        dropped = sum(1 for c in codes if c != 200)

        def show(name: str = "echo") -> dict:  # type: ignore[type-arg]
            return dict(httpx.get(f"{api}/services/{name}", headers=auth, timeout=10).json())

        cold_events = [e for e in show()["events"] if e["reason"] == "cold_start"]
        # the step: another service, steady at its one replica (the burst left echo at its maximum)
        httpx.post(f"{api}/services", json={**spec, "name": "step", "min_replicas": 1}, headers=auth,
                   timeout=30).raise_for_status()
        until(lambda: show("step")["ready_replicas"] == 1, 90)
        base = f"http://127.0.0.1:{serve_port}/s/bench/step"
        until(lambda: httpx.get(f"{base}/", headers=auth, timeout=5).status_code == 200, 30)
        step_at = time.time()
        stop = time.perf_counter() + 30

        async def step_load() -> None:
            # the small keep-alive client: httpx's own cost per request on a loaded machine kept fewer
            # than 3 requests in flight out of 16 clients
            async def worker() -> None:
                conn = await Conn.open(serve_port, "/s/bench/step/work", token)
                try:
                    while time.perf_counter() < stop and not done.is_set():
                        await conn.get()
                finally:
                    conn.close()
            await asyncio.gather(*(worker() for _ in range(STEP_CLIENTS)))

        import threading

        done = threading.Event()
        load = threading.Thread(target=lambda: asyncio.run(step_load()), daemon=True)
        load.start()
        ready_at = None
        while time.perf_counter() < stop and ready_at is None:
            if show("step")["ready_replicas"] >= 2:
                ready_at = time.time()
            time.sleep(0.05)
        scaled = [e for e in show("step")["events"] if e["reason"] == "scaled" and e["at_s"] >= step_at - 0.5]
        done.set()
        load.join()
        for name in ("echo", "step"):  # replicas outlive the server (as any pod): delete them first
            httpx.delete(f"{api}/services/{name}", headers=auth, timeout=30)
        for name in ("echo", "step"):
            url = f"{api}/services/{name}"
            until(lambda url=url: httpx.get(url, headers=auth, timeout=10).status_code == 404, 60)
        decision_s = scaled[0]["at_s"] - step_at if scaled else None
        step_ready_s = ready_at - step_at if ready_at else None
        readiness_s = ready_at - scaled[0]["at_s"] if ready_at and scaled else None
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    out = {"burst": burst, "dropped": dropped, "cold_start_first_answer_s": first_s,
           "cold_start_last_answer_s": last_s, "cold_start_events": [e["message"] for e in cold_events],
           "step_to_scale_event_s": decision_s, "step_to_new_ready_s": step_ready_s,
           "replica_readiness_s": readiness_s, "scale_event": scaled[0]["message"] if scaled else None}
    print(f"\npool: {burst} requests at zero replicas: {dropped} dropped, first answered after "
          f"{first_s:.2f} s, last after {last_s:.2f} s")
    print(f"load step to {STEP_CLIENTS} clients (target 2 in flight): scale event after {fmt(decision_s)} s, "
          f"new ready replica after {fmt(step_ready_s)} s; the replica's own readiness time "
          f"{fmt(readiness_s)} s")
    print(f"  {out['scale_event']}")
    return out


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def until(predicate: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():  # type: ignore[operator]
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError("timed out")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("router", "pool", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--burst", type=int, default=20)
    parser.add_argument("--serve-plane", help=argparse.SUPPRESS)
    parser.add_argument("--plane-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--replica-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--plane-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_plane:
        serve_plane(args.serve_plane, args.plane_port, args.replica_port, args.plane_dir)
        return
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result: dict[str, object] = {"bench": "serve_load", "args": {k: str(v) for k, v in vars(args).items()},
                                 "at": at}
    if args.part in ("router", "both"):
        result["router"] = part_router(args.rounds, args.seconds, args.rate)
    if args.part in ("pool", "both"):
        result["pool"] = part_pool(args.burst)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"serve_load-{int(time.time())}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"\nwritten {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
