"""What counting requests costs the server in the background: `limits`' in-memory storage against
gpupool's `SweptMemoryStorage` (server/ratelimit.py), side by side in one run.

    .venv/bin/python bench/rate_storage.py [--keys 1,500,2000,20000] [--seconds 3] [--rounds 2]
        [--json OUT.json]

For each number of keys (tenants, or addresses that sent tokens the pool does not know, counted in
the last minute) a fresh process counts one request for each key in the default windows
(100/second;3000/minute), then counts 200 requests a second on one key for `--seconds`, as a server
under light traffic does. `--stale`: keys counted once in a 1-second window that has passed, as
addresses seen once long ago are. It reports that process's CPU (every thread's) as a share of one core
over those seconds, the two storages alternating, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

PROBE = """
import sys, time
from limits import parse_many
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from gpupool.server.ratelimit import SweptMemoryStorage
storage = MemoryStorage() if sys.argv[1] == "library" else SweptMemoryStorage()
limiter = MovingWindowRateLimiter(storage)
items = parse_many("100/second;3000/minute")
stale = sys.argv[4] == "stale"
for i in range(int(sys.argv[2])):
    for item in parse_many("1/second") if stale else items:
        limiter.hit(item, "refused", f"2001:db8:{i:x}::/64")
if stale:  # every one of those keys' entries has left its window
    time.sleep(1.5)
    limiter.hit(items[0], "tenant", "steady")
    time.sleep(1.1)
start, cpu = time.monotonic(), time.process_time()
while time.monotonic() - start < float(sys.argv[3]):
    for item in items:
        limiter.hit(item, "tenant", "steady")
    time.sleep(0.005)
print((time.process_time() - cpu) / (time.monotonic() - start))
"""


def _share(storage: str, keys: int, seconds: float, stale: bool) -> float:
    done = subprocess.run([sys.executable, "-c", PROBE, storage, str(keys), str(seconds),
                           "stale" if stale else "live"],
                          capture_output=True, text=True, check=True)
    return float(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", default="1,500,2000,20000")
    parser.add_argument("--stale", default="20000",
                        help="numbers of keys counted once and then past their windows (none: '')")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    cases = [(int(k), False) for k in args.keys.split(",")]
    cases += [(int(k), True) for k in args.stale.split(",") if k]
    for keys, stale in cases:
        shares: dict[str, list[float]] = {"library": [], "swept": []}
        for _ in range(args.rounds):
            for storage in ("library", "swept"):
                shares[storage].append(_share(storage, keys, args.seconds, stale))
        library, swept = statistics.median(shares["library"]), statistics.median(shares["swept"])
        rows.append({"keys": keys, "stale": stale, "library_cpu_share": library, "swept_cpu_share": swept,
                     "swept_over_library": swept / library if library else float("nan"), "rounds": shares})
        print(f"{keys} keys{' past their windows' if stale else ''}: library {library:.3f}, "
              f"swept {swept:.3f} of a core", flush=True)
    table = Table(title=f"CPU of counting 200 requests a second, by keys counted (medians of {args.rounds})")
    for column in ("keys", "limits' MemoryStorage", "SweptMemoryStorage", "swept / library"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(f"{row['keys']:,}{' (past their windows)' if row['stale'] else ''}",
                      f"{row['library_cpu_share']:.3f}", f"{row['swept_cpu_share']:.3f}",
                      f"{row['swept_over_library']:.2f}")
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
