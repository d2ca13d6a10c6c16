"""What a pod's own network namespace costs its launch: p50 and p99 with namespaces on and off.

    sudo .venv/bin/python bench/pod_netns.py [--pods 100] [--burst 50] [--rounds 3] [--json FILE]

Two local agents on this machine, one giving each pod a network namespace (GPUPOOL_POD_NETNS=on) and
one not, launch `--pods` pods of `true` each, one after the other, then `--burst` pods back to back
(the namespaces a node makes ahead run out), in every round, alternating which side goes first, so
both see the same load. For each pod: the launch (the provider's launch() call: the agent plans the
pod, takes or makes its namespace, adds its rules, and the launcher helper starts it) and, one at a
time, the end (the poll that reports it ended, which hands its namespace to the teardown thread). Needs root,
iproute2 and nftables; elsewhere it says why and exits 0 without figures.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpupool.agent import netns
from gpupool.agent.netns import NetnsMode, NetworkSettings
from gpupool.pods import PodLaunch
from gpupool.providers.local import LocalProvider

NETWORK = ipaddress.IPv4Network("10.233.0.0/16")


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def one_pod(provider: LocalProvider, pod_id: str) -> tuple[float, float]:
    """(launch ms, ms of the poll that reports the pod ended)."""
    began = time.perf_counter()
    provider.launch(PodLaunch(pod_id=pod_id, workload_id=pod_id, node=provider.agent.node_name,
                              command=("/bin/true",), tenant="bench"))
    launch_ms = 1000 * (time.perf_counter() - began)
    deadline = time.monotonic() + 30
    while True:
        began = time.perf_counter()
        statuses = provider.poll()
        poll_ms = 1000 * (time.perf_counter() - began)
        status = next(s for s in statuses if s.pod_id == pod_id)
        if status.phase.is_final:
            return launch_ms, poll_ms
        if time.monotonic() > deadline:
            raise SystemExit(f"pod {pod_id} did not end within 30 s: {status}")
        time.sleep(0.002)


def burst(provider: LocalProvider, prefix: str, count: int) -> list[float]:
    """Launch ms of `count` pods launched back to back (the namespaces made ahead run out)."""
    took = []
    for i in range(count):
        began = time.perf_counter()
        provider.launch(PodLaunch(pod_id=f"{prefix}-{i}", workload_id=f"{prefix}-{i}",
                                  node=provider.agent.node_name, command=("/bin/true",), tenant="bench"))
        took.append(1000 * (time.perf_counter() - began))
    deadline = time.monotonic() + 60
    while not all(s.phase.is_final for s in provider.poll() if s.pod_id.startswith(prefix + "-")):
        if time.monotonic() > deadline:
            raise SystemExit(f"the burst {prefix} did not end within 60 s")
        time.sleep(0.01)
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burst", type=int, default=50, help="pods launched back to back per side and round")
    parser.add_argument("--json", type=Path, default=Path("bench/results/pod_netns.json"))
    args = parser.parse_args()
    why = netns.probe()
    if why:
        print(f"pod_netns: skipped, network namespaces cannot be made here: {why}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="gpupool-netns-bench-"))
    providers = {
        "on": LocalProvider(work / "on", simulate="8xH100", node_name="bench-on",
                            network=NetworkSettings(mode=NetnsMode.ON, pod_network=NETWORK)),
        "off": LocalProvider(work / "off", simulate="8xH100", node_name="bench-off",
                             network=NetworkSettings(mode=NetnsMode.OFF, pod_network=NETWORK)),
    }
    samples: dict[str, dict[str, list[float]]] = {
        k: {"launch_ms": [], "burst_launch_ms": [], "end_poll_ms": []} for k in providers}
    load = os.getloadavg()[0]
    try:
        for round_no in range(args.rounds):
            order = ["on", "off"] if round_no % 2 == 0 else ["off", "on"]
            for side in order:
                for i in range(args.pods):
                    launch_ms, poll_ms = one_pod(providers[side], f"{side}-{round_no}-{i}")
                    samples[side]["launch_ms"].append(launch_ms)
                    samples[side]["end_poll_ms"].append(poll_ms)
                samples[side]["burst_launch_ms"] += burst(providers[side], f"{side}-{round_no}-b", args.burst)
    finally:
        for provider in providers.values():
            provider.close(stop_pods=True)
    results: dict[str, object] = {"pods_per_side": args.pods * args.rounds, "rounds": args.rounds,
                                  "load_average_1m": round(load, 2)}
    table = Table(title=f"pod launch with and without its own network namespace ({args.pods * args.rounds} "
                        f"pods a side, load {load:.1f})")
    for column in ("measure", "on p50", "off p50", "ratio p50", "on p99", "off p99", "ratio p99"):
        table.add_column(column, justify="right" if column != "measure" else "left")
    for measure in ("launch_ms", "burst_launch_ms", "end_poll_ms"):
        on, off = samples["on"][measure], samples["off"][measure]
        row = {"on_p50": quantile(on, 0.5), "off_p50": quantile(off, 0.5), "on_p99": quantile(on, 0.99),
               "off_p99": quantile(off, 0.99), "on_mean": statistics.fmean(on),
               "off_mean": statistics.fmean(off)}
        row = {k: round(v, 2) for k, v in row.items()}
        row["ratio_p50"] = round(row["on_p50"] / max(row["off_p50"], 1e-9), 2)
        row["ratio_p99"] = round(row["on_p99"] / max(row["off_p99"], 1e-9), 2)
        results[measure] = row
        table.add_row(measure, f"{row['on_p50']:.1f}", f"{row['off_p50']:.1f}", f"{row['ratio_p50']:.2f}x",
                      f"{row['on_p99']:.1f}", f"{row['off_p99']:.1f}", f"{row['ratio_p99']:.2f}x")
    Console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
