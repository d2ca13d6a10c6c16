"""Faults against a real `gpupool up`, full size: prints injected | expected | observed and writes JSON.

    .venv/bin/python bench/faults.py [--submissions 1000] [--json bench/results/faults.json]

The scenarios are tests/server/fault_scenarios.py, the same that tests/server/test_faults.py runs
and asserts on. The disk-full scenario mounts a tmpfs and so needs root; it is reported as skipped
otherwise. The table goes to docs/experiments/reliability.md, "Faults" (the headline in
docs/benchmarks.md, "Reliability").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests" / "server")]

from fault_scenarios import (  # noqa: E402
    agent_killed_while_pods_run,
    cancel_resisting_pod,
    disk_full,
    kill9_during_submissions,
    mount_tmpfs,
    umount,
)
from upproc import UpProcess  # noqa: E402

FORKS = 1000


def _kill9(work: Path, n: int) -> tuple[str, str, str, dict[str, object]]:
    seen = kill9_during_submissions(work / "kill9", n)
    observed = (
        f"{len(seen.acknowledged)} acknowledged (201), {seen.cut} cut by the kill, {seen.refused} refused; "
        f"after restart {len(seen.acknowledged) - len(seen.missing_after_restart)}/{len(seen.acknowledged)} "
        f"acknowledged found, {seen.stored_after_restart} stored; final {seen.statuses}; at most "
        f"{seen.most_launches} launch, {seen.most_started_pods} pod that ran "
        f"({seen.most_pod_dirs} set up) and {seen.most_started_lines} start per "
        f"workload ({seen.seconds:.1f} s)"
    )
    return (f"kill -9 of `gpupool up` while {n:,} submissions are in flight (async client, 64 "
            "connections; killed at 40 % acknowledged), restart on the same data dir",
            "every acknowledged submission stored; none started twice", observed, asdict(seen))


def _disk_full(work: Path) -> tuple[str, str, str, dict[str, object]]:
    injected = "the store's disk full: data dir on an 8 MiB tmpfs, filled to ENOSPC, then emptied"
    expected = ("writes 503 store_unavailable in one sentence, one log line, reads work, integrity ok, "
                "writes succeed once space returns")
    if os.geteuid() != 0:
        return injected, expected, "skipped: mounting a tmpfs needs root", {}
    where = work / "disk"
    (work / "full").mkdir()
    mount_tmpfs(where, size_mib=8)
    try:
        seen = disk_full(work / "full", where, {"XDG_CONFIG_HOME": str(work / "no-config")})
    finally:
        umount(where)
    observed = (
        f"{seen.acknowledged_while_filling} more submissions fit in the log's room, then API submit "
        f"{seen.submit_status} `{seen.submit_body.get('code')}` ({seen.submit_body.get('message')}), "
        f"admin write {seen.route_write_status}, CLI exit {seen.cli_exit}; reads {seen.read_statuses}; "
        f"log: {seen.failure_log_lines} failure line, {seen.tracebacks} tracebacks; after freeing space "
        f"submit {seen.recovered_status}, {seen.recovery_log_lines} recovery line; integrity_check "
        f"{seen.integrity}; {seen.stored} stored of {seen.expected_stored} acknowledged"
    )
    return injected, expected, observed, asdict(seen)


def _resisting(work: Path) -> list[tuple[str, str, str, dict[str, object]]]:
    server = UpProcess(work / "resist" / "data", ["--simulate", "1x2xH100"])
    (work / "resist").mkdir()
    rows = []
    try:
        server.start()
        forker = (f"trap '' TERM; i=0; while [ $i -lt {FORKS} ]; do sleep 120 & i=$((i+1)); done; "
                  "(sleep 120 &) ; wait")
        seen = cancel_resisting_pod(server, forker, expect_processes=FORKS + 2)
        rows.append((f"a pod that ignores SIGTERM and forks {FORKS:,} children (and one orphan); cancel",
                     "no process of the pod left (/proc)",
                     f"{seen.peak_processes} processes at cancel; workload {seen.status}; "
                     f"{len(seen.left)} left", asdict(seen)))
        if shutil.which("setsid"):
            seen = cancel_resisting_pod(server, "setsid sleep 120 & exec sleep 120", expect_processes=3)
            left = ", ".join(f"pid {p.pid} `{p.command}` (own session)" for p in seen.left) or "none"
            rows.append(("a pod whose child calls setsid() (leaves the pod's process group); cancel",
                         "no process of the pod left (/proc)",
                         f"workload {seen.status}; left: {left}" + (" **(known gap)**" if seen.left else ""),
                         asdict(seen)))
    finally:
        server.stop()
    return rows


def _agent(work: Path) -> tuple[str, str, str, dict[str, object]]:
    (work / "agent").mkdir()
    seen = agent_killed_while_pods_run(work / "agent", pods=3)
    return ("kill -9 of `gpupool up` (its agent in-process) while 3 local pods run; restart",
            "pods survive, are re-adopted, finish succeeded, never started twice",
            f"{seen.survived_kill}/{seen.pods} survived the kill, {seen.adopted} re-adopted, same "
            f"processes: {seen.same_processes}; final {seen.statuses}; at most {seen.most_launches} launch "
            f"and {seen.most_started_lines} start per workload", asdict(seen))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=Path("bench/results/faults.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-faults-") as tmp:
        work = Path(tmp)
        (work / "kill9").mkdir()
        rows = [_kill9(work, args.submissions), _disk_full(work), *_resisting(work), _agent(work)]
    print("| injected | expected | observed |\n|---|---|---|")
    for injected, expected, observed, _ in rows:
        print(f"| {injected} | {expected} | {observed} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps([{"injected": i, "expected": e, "observed": o, "raw": raw}
                                     for i, e, o, raw in rows], indent=2, default=str))


if __name__ == "__main__":
    main()
