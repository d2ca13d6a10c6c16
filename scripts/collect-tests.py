"""Collect the test suite once before it runs, a share of it in each of as many processes as there are
cores, so that the pytest workers all start from the same bytecode: the package's, the libraries' the
tests import, and pytest's rewritten test modules. Without it every worker compiles and rewrites
them again; in one process it is a single core's work on the path to the first test.

    python scripts/collect-tests.py [PROCESSES]

Each process collects `tests` as a run does, with the other shares' top-level entries ignored, so
conftest files are imported in the order a run imports them (tests/server's modules import their
own conftest by name). Exits non-zero, printing what pytest printed, when a share cannot be
collected (an import error, a syntax error).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def shares(weights: dict[str, int], count: int) -> list[list[str]]:
    """The entries in `count` shares of about equal weight (the heaviest first, each to the lightest
    share so far); every entry in exactly one share."""
    dealt: list[list[str]] = [[] for _ in range(count)]
    load = [0] * count
    for name in sorted(weights, key=lambda name: (-weights[name], name)):
        lightest = load.index(min(load))
        dealt[lightest].append(name)
        load[lightest] += weights[name]
    return [sorted(share) for share in dealt if share]


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    tests = root / "tests"
    count = int(argv[0]) if argv else len(os.sched_getaffinity(0))
    weights = {}
    for entry in tests.iterdir():
        if entry.is_dir() and entry.name != "__pycache__":
            weights[entry.name] = sum(1 for _ in entry.rglob("test_*.py"))
        elif entry.is_file() and entry.name.startswith("test_") and entry.suffix == ".py":
            weights[entry.name] = 1
    weights = {name: weight for name, weight in weights.items() if weight}
    runs = []
    for share in shares(weights, max(1, count)):
        others = [f"--ignore=tests/{name}" for name in sorted(weights) if name not in share]
        command = [sys.executable, "-m", "pytest", "--collect-only", "-qq", "-p", "no:cacheprovider",
                   "tests", *others]
        runs.append(subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    failed = 0
    for run in runs:
        output, _ = run.communicate()
        if run.returncode != 0:
            failed = run.returncode
            sys.stdout.buffer.write(output)
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
