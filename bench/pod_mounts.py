"""What a pod's own mount namespace costs its launch: a secret file, and a mount plus a secret file,
against the same agent's plain pods, p50 and p99.

    sudo .venv/bin/python bench/pod_mounts.py [--pods 50] [--rounds 3] [--json FILE]

One local agent (root, no network namespaces) launches `--pods` pods of `true` per side and round,
one after the other, interleaved pod by pod with the sides' order rotated, so all see the same
load: `plain`
(no mount namespace), `secret` (one secret as a variable and as a file under /run/secrets: the
helper unshares the mount namespace, mounts a tmpfs and writes the file), and `mount+secret` (the
same plus one read-only bind of a directory, resolved and opened by the agent first). For each pod
the launch (the provider's launch() call, the helper's answer included) and the poll that
reports it ended. Needs root; elsewhere it says why and exits 0 without figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpupool.pods import PodLaunch, PodMount, PodSecret
from gpupool.providers.local import LocalProvider

SIDES = ("plain", "secret", "mount+secret")


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def launch_of(side: str, pod_id: str, node: str, root: Path) -> PodLaunch:
    value = {"k": b"v" * 64}
    secrets = (PodSecret("bench", env="BENCH_TOKEN", data=value),
               PodSecret("bench", path="/run/secrets/bench", data=value)) if side != "plain" else ()
    mounts = (PodMount(str(root / "set"), "/mnt", True, str(root)),) if side == "mount+secret" else ()
    return PodLaunch(pod_id=pod_id, workload_id=pod_id, node=node, command=("/bin/true",), tenant="bench",
                     secrets=secrets, mounts=mounts)


def one_pod(provider: LocalProvider, launch: PodLaunch) -> tuple[float, float]:
    """(launch ms, ms of the poll that reports the pod ended)."""
    began = time.perf_counter()
    provider.launch(launch)
    launch_ms = 1000 * (time.perf_counter() - began)
    deadline = time.monotonic() + 30
    while True:
        began = time.perf_counter()
        statuses = provider.poll()
        poll_ms = 1000 * (time.perf_counter() - began)
        status = next(s for s in statuses if s.pod_id == launch.pod_id)
        if status.phase.is_final:
            if status.exit_code != 0:
                raise SystemExit(f"pod {launch.pod_id} failed: {status.message}")
            return launch_ms, poll_ms
        if time.monotonic() > deadline:
            raise SystemExit(f"pod {launch.pod_id} did not end within 30 s: {status}")
        time.sleep(0.002)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("bench/results/pod_mounts.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("pod_mounts: skipped, mount namespaces and pod accounts need root")
        return 0
    work = Path(tempfile.mkdtemp(prefix="gpupool-mounts-bench-"))
    root = work / "data"
    (root / "set").mkdir(parents=True)
    for path in (root, root / "set"):
        path.chmod(0o755)
    provider = LocalProvider(work / "agent", simulate="8xH100", node_name="bench")
    samples: dict[str, dict[str, list[float]]] = {s: {"launch_ms": [], "end_poll_ms": []} for s in SIDES}
    load = os.getloadavg()[0]
    try:
        one_pod(provider, launch_of("plain", "warm", "bench", root))  # the account and its helper
        for round_no in range(args.rounds):
            for i in range(args.pods):  # interleaved pod by pod, the order rotated: the same load drift
                turn = round_no * args.pods + i
                for side in SIDES[turn % 3:] + SIDES[:turn % 3]:
                    pod_id = f"{side.replace('+', '-')}-{round_no}-{i}"
                    launch_ms, poll_ms = one_pod(provider, launch_of(side, pod_id, "bench", root))
                    samples[side]["launch_ms"].append(launch_ms)
                    samples[side]["end_poll_ms"].append(poll_ms)
    finally:
        provider.close(stop_pods=True)
    results: dict[str, object] = {"pods_per_side": args.pods * args.rounds, "rounds": args.rounds,
                                  "load_average_1m": round(load, 2)}
    table = Table(title=f"pod launch with its own mount namespace ({args.pods * args.rounds} pods a side, "
                        f"load {load:.1f})")
    for column in ("side", "measure", "p50 ms", "p99 ms", "mean ms", "x plain p50", "x plain p99"):
        table.add_column(column, justify="left" if column in ("side", "measure") else "right")
    for side in SIDES:
        for measure in ("launch_ms", "end_poll_ms"):
            values, plain = samples[side][measure], samples["plain"][measure]
            row = {"p50": quantile(values, 0.5), "p99": quantile(values, 0.99),
                   "mean": statistics.fmean(values)}
            row = {k: round(v, 2) for k, v in row.items()}
            row["ratio_p50"] = round(row["p50"] / max(quantile(plain, 0.5), 1e-9), 2)
            row["ratio_p99"] = round(row["p99"] / max(quantile(plain, 0.99), 1e-9), 2)
            results[f"{side}:{measure}"] = row
            table.add_row(side, measure, f"{row['p50']:.1f}", f"{row['p99']:.1f}", f"{row['mean']:.1f}",
                          f"{row['ratio_p50']:.2f}x", f"{row['ratio_p99']:.2f}x")
    Console(width=120).print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
