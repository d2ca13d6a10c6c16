"""The federation hub live on loopback: three member pools (`gpupool up --provider fake`, SQLite each)
and a hub (`gpupool up --federation`), each its own process.

1. Latency: the same submission posted to the hub and directly to a member, in alternating blocks
   (hub, direct, hub, direct, ...) on keep-alive connections; p50/p95 of each side and what the hub
   adds (its target: at most 5 ms at p50).
2. Failure: WORK long workloads through the hub (home: east, under policy home), east killed
   (SIGKILL) once all are placed there; time from the kill until each runs on another member, how
   many acknowledged submissions the hub lost, then east started again on its store and the time
   until its stale copies are cancelled, sampling every member meanwhile for a workload active in
   two members at once.
3. Partition (with --partition, as root with iptables): a second federation whose members fence
   (federation.fence FENCE s, the hub's grace FENCE + 1 s); WORK long workloads on east, then the
   hub's connections to east rejected on loopback while both keep running: time until east has
   stopped every copy, time until each runs on another member, samples of a workload running in
   two members at once, and, the link back, the time until east's stale copies are cancelled.

  .venv/bin/python bench/federation.py --blocks 10 --per-block 50 --work 12 --partition
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from gpupool.federation.loopback import ALICE, Federation, copies, start_federation, until


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency(fed: Federation, blocks: int, per_block: int) -> dict[str, Any]:
    east = fed.member("east")
    with east.admin() as admin:
        direct_token = admin.post("/tokens", json={"tenant": ALICE, "name": "direct"}).json()["token"]
    body = {"command": ["x"], "env": {"GPUPOOL_FAKE_DURATION_S": "0.5"}}
    sides: dict[str, list[float]] = {"hub": [], "direct": []}
    assert fed.hub is not None
    clients = {"hub": fed.hub_api(),
               "direct": httpx.Client(base_url=east.url + "/api/v1", timeout=10,
                                      headers={"Authorization": f"Bearer {direct_token}"})}
    for client in clients.values():  # connections open and code paths warm before timing
        for _ in range(5):
            client.post("/workloads", json=body).raise_for_status()
    for _ in range(blocks):
        for side in ("hub", "direct"):
            client = clients[side]
            for _ in range(per_block):
                start = time.perf_counter()
                answer = client.post("/workloads", json=body)
                sides[side].append((time.perf_counter() - start) * 1000)
                assert answer.status_code == 201, answer.text
    for client in clients.values():
        client.close()
    out = {side: {"n": len(v), "p50_ms": statistics.median(v), "p95_ms": _pct(v, 0.95)}
           for side, v in sides.items()}
    out["added_p50_ms"] = out["hub"]["p50_ms"] - out["direct"]["p50_ms"]
    out["ratio_p50"] = out["hub"]["p50_ms"] / out["direct"]["p50_ms"]
    return out


def failure(fed: Federation, work: int) -> dict[str, Any]:
    east = fed.member("east")
    others = [m for m in fed.members if m.name != "east"]
    body = {"command": ["x"], "resources": {"gpus": 1}, "env": {"GPUPOOL_FAKE_DURATION_S": "3600"}}
    with fed.hub_api() as api:
        acknowledged = [api.post("/workloads", json=body).json()["id"] for _ in range(work)]
    until(lambda: len([i for i in acknowledged if i in copies(east)]) == work, 60, "all placed on east")
    killed = time.monotonic()
    east.kill()
    replaced: dict[str, float] = {}
    twice = 0

    def record() -> bool:
        nonlocal twice
        held = [copies(m) for m in others]
        twice += sum(1 for i in acknowledged if sum(i in h for h in held) > 1)
        running = {i for h in held for i, items in h.items() if items[0]["status"] == "running"}
        for workload_id in running & set(acknowledged):
            replaced.setdefault(workload_id, time.monotonic() - killed)
        return len(replaced) == work

    until(record, 120, "all running elsewhere")
    with fed.hub_api() as api:
        known = {i for i in acknowledged if api.get(f"/federation/workloads/{i}").status_code == 200}
    restart = time.monotonic()
    east.start()
    east.wait_up()
    up_s = time.monotonic() - restart
    max_active_twice = max_running_twice = 0

    def swept() -> bool:
        nonlocal max_active_twice, max_running_twice
        held = [copies(m) for m in fed.members]
        running = [{i for i, items in h.items() if items[0]["status"] == "running"} for h in held]
        max_active_twice = max(max_active_twice,
                               sum(1 for i in acknowledged if sum(i in h for h in held) > 1))
        max_running_twice = max(max_running_twice,
                                sum(1 for i in acknowledged if sum(i in r for r in running) > 1))
        return not any(i in held[0] for i in acknowledged)

    until(swept, 120, "stale copies cancelled")
    cleared = time.monotonic() - restart
    final = [copies(m) for m in fed.members]
    return {
        "workloads": work, "acknowledged": len(acknowledged), "lost": len(acknowledged) - len(known),
        "replace_p50_s": statistics.median(replaced.values()), "replace_max_s": max(replaced.values()),
        "active_twice_while_down": twice, "member_restart_s": up_s,
        "stale_cleared_after_restart_s": cleared, "active_twice_after_return_max": max_active_twice,
        "running_twice_after_return_max": max_running_twice,
        "active_twice_at_end": sum(1 for i in acknowledged if sum(i in h for h in final) > 1),
    }


def partition(fed: Federation, work: int) -> dict[str, Any]:
    from gpupool.federation.loopback import UNCUT, cut_link  # here: bench/side_by_side.py runs the
    # latency part against older checkouts, which lack them
    east = fed.member("east")
    others = [m for m in fed.members if m.name != "east"]
    body = {"command": ["x"], "resources": {"gpus": 1}, "env": {"GPUPOOL_FAKE_DURATION_S": "3600"}}
    with fed.hub_api() as api:
        acknowledged = [api.post("/workloads", json=body).json()["id"] for _ in range(work)]
    def placed() -> bool:  # all on east, as many running as its 8 GPUs hold
        held = {i: c for i, c in copies(east).items() if i in acknowledged}
        return len(held) == work and sum(c[0]["status"] == "running" for c in held.values()) == min(work, 8)

    until(placed, 60, "all placed on east")
    cut = time.monotonic()
    cut_link(east.port, True)
    stopped_s: float | None = None
    replaced: dict[str, float] = {}
    twice = 0
    seen: list[dict[str, Any]] = []
    try:
        def record() -> bool:
            nonlocal stopped_s, twice
            held = [copies(m, source=UNCUT) for m in fed.members]
            running = [{i for i, items in h.items() if items[0]["status"] == "running"} for h in held]
            both = [i for i in acknowledged if sum(i in r for r in running) > 1]
            twice += len(both)
            seen.extend({"at_s": round(time.monotonic() - cut, 2), "id": i,
                         "where": [(m.name, h[i][0]["id"], h[i][0]["status"])
                                   for m, h in zip(fed.members, held, strict=True) if i in h]} for i in both)
            if stopped_s is None and not running[0] & set(acknowledged):
                stopped_s = time.monotonic() - cut
            for r in running[1:]:
                for workload_id in r & set(acknowledged):
                    replaced.setdefault(workload_id, time.monotonic() - cut)
            return len(replaced) == work

        until(record, 120, "all running elsewhere")
    finally:
        cut_link(east.port, False)
    back = time.monotonic()
    until(lambda: not any(i in copies(east) for i in acknowledged), 120, "stale copies cancelled")
    return {"workloads": work, "fence_s": fed_fence(fed), "all_stopped_on_cut_member_s": stopped_s,
            "replace_p50_s": statistics.median(replaced.values()), "replace_max_s": max(replaced.values()),
            "running_twice_samples": twice, "stale_cleared_after_link_back_s": time.monotonic() - back,
            "others": [m.name for m in others], "twice_seen": seen[:20]}


def fed_fence(fed: Federation) -> float:
    text = (fed.root / "member.yaml").read_text()
    return float(text.split("fence:")[1].strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--per-block", type=int, default=50)
    parser.add_argument("--work", type=int, default=12)
    parser.add_argument("--latency-only", action="store_true",
                        help="only the submission latency (for bench/side_by_side.py)")
    parser.add_argument("--partition", action="store_true", help="also the partition run (root, iptables)")
    parser.add_argument("--fence", type=float, default=2.0, help="the members' federation.fence (s)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/federation.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-fed-") as root:
        fed = start_federation(Path(root), simulate="1x8xH100", down_after_s=2.0, grace_s=1.0,
                               poll_s=0.25)
        try:
            lat = latency(fed, args.blocks, args.per_block)
            fail = failure(fed, args.work) if not args.latency_only else None
        finally:
            fed.stop()
    if fail is None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"latency": lat, "hub_p50_ms": lat["hub"]["p50_ms"],
                                         "direct_p50_ms": lat["direct"]["p50_ms"],
                                         "added_p50_ms": lat["added_p50_ms"]}, indent=2) + "\n")
        print(f"submit p50: direct {lat['direct']['p50_ms']:.2f} ms, hub {lat['hub']['p50_ms']:.2f} ms")
        return
    cut: dict[str, Any] | None = None
    if args.partition:
        with tempfile.TemporaryDirectory(prefix="gpupool-fed-") as root:
            fed = start_federation(Path(root), simulate="1x8xH100", down_after_s=1.0,
                                   grace_s=args.fence + 1.0, poll_s=0.25, fence_s=args.fence)
            try:
                cut = partition(fed, args.work)
            finally:
                fed.stop()
    table = Table(title="federation hub on loopback (3 members, fake provider)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("submit p50 direct to a member (ms)", f"{lat['direct']['p50_ms']:.2f}")
    table.add_row("submit p50 through the hub (ms)", f"{lat['hub']['p50_ms']:.2f}")
    table.add_row("hub adds at p50 (ms) / ratio", f"{lat['added_p50_ms']:.2f} / {lat['ratio_p50']:.2f}x")
    table.add_row("submit p95 direct / hub (ms)",
                  f"{lat['direct']['p95_ms']:.2f} / {lat['hub']['p95_ms']:.2f}")
    table.add_row("acknowledged / lost", f"{fail['acknowledged']} / {fail['lost']}")
    table.add_row("re-placed and running: p50 / max (s after kill)",
                  f"{fail['replace_p50_s']:.2f} / {fail['replace_max_s']:.2f}")
    table.add_row("active in two members while down (samples)", str(fail["active_twice_while_down"]))
    table.add_row("stale copies cancelled (s after restart)", f"{fail['stale_cleared_after_restart_s']:.2f}")
    table.add_row("most workloads pending or running twice after return (samples)",
                  str(fail["active_twice_after_return_max"]))
    table.add_row("most workloads running twice after return (samples)",
                  str(fail["running_twice_after_return_max"]))
    table.add_row("active in two members at the end", str(fail["active_twice_at_end"]))
    if cut is not None:
        table.add_row(f"partition (fence {cut['fence_s']:g} s): all stopped on the cut member (s)",
                      f"{cut['all_stopped_on_cut_member_s']:.2f}")
        table.add_row("partition: running elsewhere p50 / max (s after the cut)",
                      f"{cut['replace_p50_s']:.2f} / {cut['replace_max_s']:.2f}")
        table.add_row("partition: running in two members (samples)", str(cut["running_twice_samples"]))
        table.add_row("partition: stale copies cancelled (s after the link is back)",
                      f"{cut['stale_cleared_after_link_back_s']:.2f}")
    Console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    result = {"latency": lat, "failure": fail, "partition": cut,
              "args": vars(args) | {"json": str(args.json)}}
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
