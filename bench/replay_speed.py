"""Benchmark: the Philly replay with a fabric and the communication model, an earlier commit beside this one.

Issue 37 asks for this replay faster with the same decisions. The script takes REF's `src` (git
archive, nothing checked out), generates the fat tree the measurements use (16 ports, 2 levels,
oversubscription 2), and replays the window on both sides alternately (ref, head; then head, ref;
...), each in its own process with its side's `gpupool` first on PYTHONPATH. It prints every
replay's wall and CPU (user) seconds and the hash of its result (the JSON less `wall_s` and
`cycle_ms_mean`: sha256 of the sorted dump, 16 hex digits, equal when every decision was), the
ratio of the medians (head / ref), and writes JSON.

    python bench/replay_speed.py --ref 5fe1c79 --window 2017-10-01:2017-10-15 --rounds 2
    python bench/replay_speed.py --ref 5fe1c79 --cluster 16x8xV100M32 --window 2017-10-01:2017-10-04 --moves
    python bench/replay_speed.py --ref 7b2793a --no-fabric --window all

`--no-fabric` replays the results page's configuration (e) instead: drf, first-fit, preemption and
backfill, no fabric; `--window all` replays the whole trace.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpupool.sim.datadir import require_data_dir

ROOT = Path(__file__).resolve().parents[1]
MAIN = "from gpupool.cli.main import main; main()"


def result_hash(result: dict[str, Any]) -> str:
    """The replay's result without its timings, hashed (equal results: equal decisions). The files
    the configuration names (the fabric, the --config file) count by name only: they lie in a
    temporary folder of each run, so with their paths a fabric replay's hash changed from one run
    of this script to the next."""
    kept = {k: v for k, v in result.items() if k not in ("wall_s", "cycle_ms_mean")}
    config = kept.get("config")
    if isinstance(config, dict):
        kept["config"] = {k: Path(v).name if k in ("fabric", "config_file") and isinstance(v, str) else v
                          for k, v in config.items()}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def _cli(src: Path, args: list[str]) -> tuple[float, float]:
    """Run `gpupool ARGS` with `src` first on PYTHONPATH; (wall s, user CPU s) of the process."""
    env = dict(os.environ, PYTHONPATH=str(src))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    tick = time.perf_counter()
    subprocess.run([sys.executable, "-c", MAIN, *args], env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - tick
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", required=True, help="The commit to compare with (its src is archived).")
    parser.add_argument("--cluster", default="64x8xV100M32")
    parser.add_argument("--window", default="2017-10-01:2017-10-04")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--moves", action="store_true", help="Topology moves on (scheduling.topology_moves).")
    parser.add_argument("--no-fabric", action="store_true",
                        help="drf + first-fit + preemption + backfill, no fabric (the results page's (e)).")
    parser.add_argument("--json", type=Path, default=Path("bench/results/replay_speed.json"))
    args = parser.parse_args()
    trace = require_data_dir() / "philly" / "philly-sia.csv"
    console = Console()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.ref, "src"], check=True,
                                 capture_output=True).stdout
        (work / "ref").mkdir()
        subprocess.run(["tar", "-x", "-C", str(work / "ref")], input=archive, check=True)
        sources = {"ref": work / "ref" / "src", "head": ROOT / "src"}
        tree = work / "tree.topo"
        _cli(sources["head"], ["fabric", "generate", "fat-tree", "--ports", "16", "--levels", "2",
                               "--oversubscription", "2", "--out", str(tree)])
        replay = ["sim", "replay", "--trace", f"philly:{trace}", "--cluster", args.cluster,
                  "--seed", str(args.seed)]
        if args.window != "all":
            replay += ["--window", args.window]
        if args.no_fabric:
            replay += ["--ordering", "drf", "--policy", "first-fit", "--preemption", "--backfill"]
        else:
            replay += ["--policy", "network-aware", "--backfill", "--fabric", str(tree),
                       "--comm-model", "default"]
        if args.moves:
            config = work / "moves.yaml"
            config.write_text("scheduling:\n  topology_moves: true\n")
            replay += ["--config", str(config)]
        for r in range(args.rounds):
            for side in ("ref", "head") if r % 2 == 0 else ("head", "ref"):
                out = work / f"{side}-{r}.json"
                wall, user = _cli(sources[side], [*replay, "--json", str(out)])
                result = json.loads(out.read_text())
                rows.append({"round": r + 1, "side": side, "wall_s": wall, "user_s": user,
                             "replay_wall_s": result["wall_s"], "cycles": result["cycles"],
                             "hash": result_hash(result)})
                console.print(f"round {r + 1} {side}: {wall:.1f} s wall, {user:.1f} s user")
    what = ("drf + first-fit + preemption + backfill" if args.no_fabric
            else "network-aware + backfill + fabric") + (" + moves" if args.moves else "")
    table = Table(title=f"Philly {args.window} on {args.cluster}, {what}")
    for column in ("round", "side", "wall s", "user s", "replay wall s", "cycles", "result hash"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(str(row["round"]), row["side"], f"{row['wall_s']:.1f}", f"{row['user_s']:.1f}",
                      f"{row['replay_wall_s']:.1f}", str(row["cycles"]), row["hash"])
    console.print(table)
    median = {side: {k: statistics.median(r[k] for r in rows if r["side"] == side)
                     for k in ("wall_s", "user_s", "replay_wall_s")} for side in ("ref", "head")}
    ratios = {k: median["head"][k] / median["ref"][k] for k in ("wall_s", "user_s", "replay_wall_s")}
    same = len({r["hash"] for r in rows}) == 1
    console.print(f"head / ref (medians): wall {ratios['wall_s']:.3f}, user {ratios['user_s']:.3f}, "
                  f"replay wall {ratios['replay_wall_s']:.3f}; results {'equal' if same else 'DIFFER'}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"ref": args.ref, "cluster": args.cluster, "window": args.window,
                                     "seed": args.seed, "moves": args.moves, "no_fabric": args.no_fabric,
                                     "rounds": rows,
                                     "median": median, "ratio": ratios, "same_result": same}, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
