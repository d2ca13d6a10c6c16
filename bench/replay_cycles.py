"""Benchmark: where a replay's cycles spend their time, by what woke them and what they decided.

Runs `gpupool sim replay` with the given arguments in this process, timing every `cycle_on` the
replay makes and noting the events of its batch (arrivals, finishes, both, other), whether the cycle
admitted work and whether it stopped any (preempted, evicted, moved). Prints one row per kind of
cycle (count, CPU seconds of the cycles, share, mean pending) and writes JSON. The wrapper changes
no decision: the replay's own result is written where its `--json` says.

    GPUPOOL_DATA_DIR=DATA .venv/bin/python bench/replay_cycles.py -- --trace philly:FILE \\
        --cluster 64x8xV100M32 --seed 1 --ordering drf --policy first-fit --preemption --backfill

`--considerations` also times each workload the walk considers (`_Cycle._consider`: placed,
preempted for, reserved for or refused) by what came of it, and each of the head's reservations
by how it was found. A consideration that waited for the reason and message its (queue, shape,
rank) got the last time one was considered is what a cycle carrying verdicts across cycles could
at most skip; a reservation searched afresh that found the start the last one for the same head had
is what carrying reservations could at most skip. Together they bound such a design's gain.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import gpupool.core.scheduling.backfill as backfill_module
import gpupool.core.scheduling.cycle as cycle_module
import gpupool.sim.replay as replay_module
from gpupool.cli.main import main as gpupool_main
from gpupool.core.scheduling.cycle import Admit, CycleResult, Refuse, Reserve, Stop, Wait


def _woken_by(events: Sequence[Any]) -> str:
    kinds = {e.kind for e in events}
    if kinds <= {"arrive"}:
        return "arrivals"
    if kinds <= {"finish"}:
        return "finishes"
    if kinds <= {"arrive", "finish"}:
        return "arrivals and finishes"
    return "other (" + ", ".join(sorted(kinds - {"arrive", "finish"})) + ")"


def _decided(result: CycleResult) -> str:
    admitted = any(type(d) is Admit for d in result.decisions)
    stopped = any(type(d) is Stop for d in result.decisions)
    if admitted and stopped:
        return "admissions and stops"
    if admitted:
        return "admissions"
    return "stops" if stopped else "nothing (all wait)"


Verdicts = dict[str, tuple[Any, str]]
"""A cycle's waits: workload id -> (reason, message)."""


@dataclass
class Quiet:
    """What a cycle that admitted and stopped nothing left: its waits, the verdicts per key, its
    reservation (head, start)."""

    waits: Verdicts
    by_key: dict[Any, set[tuple[Any, str]]]
    reserve: tuple[str, float] | None


def quiet_of(result: CycleResult, key_of: Callable[[str], Any]) -> Quiet | None:
    """The cycle as a `Quiet`, or None when it admitted, stopped or refused anything."""
    waits: Verdicts = {}
    reserve = None
    for d in result.decisions:
        if type(d) is Wait:
            waits[d.workload_id] = (d.reason, d.message)
        elif type(d) is Reserve:
            reserve = (d.workload_id, d.start_s)
        else:
            return None
    by_key: dict[Any, set[tuple[Any, str]]] = {}
    for wid, verdict in waits.items():
        by_key.setdefault(key_of(wid), set()).add(verdict)
    return Quiet(waits, by_key, reserve)


def repeats(before: Quiet, now: Quiet, key_of: Callable[[str], Any]) -> bool:
    """Whether a quiet cycle after a quiet one decided what carrying the earlier one's verdicts
    would: every workload that waited before waits for the same reason and message, the same head
    is reserved for the same start, and every workload new to the list gets the one verdict its
    (queue, shape, rank) had before."""
    if now.reserve != before.reserve:
        return False
    for wid, verdict in now.waits.items():
        was = before.waits.get(wid)
        if was is None:
            if before.by_key.get(key_of(wid)) != {verdict}:
                return False
        elif was != verdict:
            return False
    return True


def consideration_kind(new: Sequence[Any], reserved: bool, last: tuple[Any, str] | None
                       ) -> tuple[str, tuple[Any, str] | None]:
    """What came of one consideration, from the decisions it added (`new`) and whether it made the
    cycle's reservation; and its verdict (reason, message) where it waited or was refused (None
    otherwise). `last`: its key's verdict the last time a workload of that key was considered."""
    if any(type(d) is Stop for d in new):
        return "preempted its way in", None
    if any(type(d) is Admit for d in new):
        return "admitted", None
    if reserved:
        return "reserved for (the head)", None
    if len(new) == 1 and type(new[0]) in (Wait, Refuse):
        verdict = (new[0].reason, new[0].message)
        return ("waited, as its key last did" if verdict == last else "waited, otherwise"), verdict
    return "other", None


def _tally(rows: dict[str, list[float]], kind: str, spent: float) -> None:
    """One more of `kind`, and the CPU seconds it took."""
    row = rows.setdefault(kind, [0, 0.0])
    row[0] += 1
    row[1] += spent


class Considerations:
    """Times `_Cycle._consider` and `kept_reserve` in the replay (see the module docstring)."""

    def __init__(self) -> None:
        self.rows: dict[str, list[float]] = {}
        self.searches: dict[str, list[float]] = {}
        self.last: dict[Any, tuple[Any, str] | None] = {}
        self.last_start: tuple[str, float | None] | None = None
        """(head id, start) of the last reservation made or kept (None: none yet)."""
        self._consider = cycle_module._Cycle._consider
        self._kept_reserve = cycle_module.kept_reserve
        self._search = backfill_module._reserve

    def install(self) -> None:
        consider, kept_reserve, search = self._consider, self._kept_reserve, self._search
        searched: list[bool] = [False]

        def timed_consider(cycle: Any, original: Any, meta: Any) -> None:
            before, reserved = len(cycle.decisions), cycle.reservation
            tick = time.process_time()
            consider(cycle, original, meta)
            spent = time.process_time() - tick
            kind, verdict = consideration_kind(cycle.decisions[before:], cycle.reservation is not reserved,
                                               self.last.get(meta.key))
            self.last[meta.key] = verdict
            _tally(self.rows, kind, spent)

        def counted_search(*args: Any, **kwargs: Any) -> Any:
            searched[0] = True
            return search(*args, **kwargs)

        def timed_kept_reserve(head: Any, *args: Any, **kwargs: Any) -> Any:
            searched[0] = False
            tick = time.process_time()
            found = kept_reserve(head, *args, **kwargs)
            spent = time.process_time() - tick
            start = None if found is None else found.start_s
            if not searched[0]:
                kind = "reused or carried"
            elif self.last_start is None or self.last_start[0] != head.id:
                kind = "searched: a new head"
            else:
                kind = ("searched: the same start again" if self.last_start[1] == start
                        else "searched: another start")
            self.last_start = (head.id, start)
            _tally(self.searches, kind, spent)
            return found

        cycle_module._Cycle._consider = timed_consider  # type: ignore[method-assign]
        cycle_module.kept_reserve = timed_kept_reserve
        backfill_module._reserve = counted_search

    def remove(self) -> None:
        cycle_module._Cycle._consider = self._consider  # type: ignore[method-assign]
        cycle_module.kept_reserve = self._kept_reserve
        backfill_module._reserve = self._search

    def report(self, total: float) -> dict[str, Any]:
        """Prints both tables (shares of the cycles' CPU, `total` s) and returns them for the JSON."""
        console = Console()
        out: dict[str, Any] = {}
        for title, rows in (("considerations by what came of them", self.rows),
                            ("the head's reservations by how they were found", self.searches)):
            table = Table(title=title)
            for column in ("kind", "count", "CPU s", "share of the cycles"):
                table.add_column(column, justify="left" if column == "kind" else "right")
            ordered = sorted(rows.items(), key=lambda kv: -kv[1][1])
            for kind, (count, spent) in ordered:
                table.add_row(kind, f"{count:,}", f"{spent:.1f}", f"{100 * spent / total:.1f} %")
            console.print(table)
            out[title] = [{"kind": kind, "count": count, "cpu_s": spent, "share": spent / total}
                          for kind, (count, spent) in ordered]
        considered = sum(r[1] for r in self.rows.values())
        same = self.rows.get("waited, as its key last did", [0, 0.0])[1]
        again = self.searches.get("searched: the same start again", [0, 0.0])[1]
        out["outside_considerations_share"] = 1 - considered / total
        out["carry_ceiling_share"] = (same + again) / total
        left = 100 * (1 - (same + again) / total)
        console.print(f"Outside any consideration (the order, the walk, the waits, the cycle's set-up): "
                      f"{100 * (1 - considered / total):.1f} % of the cycles' CPU. Skipping every "
                      f"consideration that waited as its key last did and every search that found the "
                      f"same start again, at no cost, would leave {left:.1f} %.")
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s [--json OUT] -- REPLAY-ARGS...")
    parser.add_argument("--json", type=Path, default=Path("bench/results/replay_cycles.json"))
    parser.add_argument("--considerations", action="store_true",
                        help="also time each consideration and reservation by what came of it")
    parser.add_argument("replay", nargs=argparse.REMAINDER, help="the arguments of `gpupool sim replay`")
    args = parser.parse_args()
    replay_args = [a for a in args.replay if a != "--"]
    if not replay_args:
        parser.error("give the replay's arguments after --, e.g. -- --trace philly:FILE "
                     "--cluster 16x8xV100M32")
    rows: dict[tuple[str, str], list[float]] = {}
    woken = ["none"]
    batch, cycle_on = replay_module.Replay._batch, replay_module.cycle_on

    def timed_batch(self: Any, now_s: float, events: Sequence[Any]) -> None:
        woken[0] = _woken_by(events)
        batch(self, now_s, events)

    last: list[Quiet | None] = [None]
    repeated = [0, 0.0]
    """Cycles woken by arrivals alone that repeat the quiet cycle before them (`repeats`), CPU s."""

    def timed_cycle(view: Any, pending: Sequence[Any], *rest: Any) -> CycleResult:
        tick = time.process_time()
        result = cycle_on(view, pending, *rest)
        spent = time.process_time() - tick
        row = rows.setdefault((woken[0], _decided(result)), [0, 0.0, 0])
        row[0] += 1
        row[1] += spent
        row[2] += len(pending)
        metas = view.metas
        key_of = lambda wid: metas[wid].key if wid in metas else wid  # noqa: E731
        quiet, before = quiet_of(result, key_of), last[0]
        if woken[0] == "arrivals" and before is not None and quiet is not None \
                and repeats(before, quiet, key_of):
            repeated[0] += 1
            repeated[1] += spent
        last[0] = quiet
        return result

    replay_module.Replay._batch = timed_batch  # type: ignore[method-assign]
    replay_module.cycle_on = timed_cycle  # type: ignore[assignment]
    considerations = Considerations() if args.considerations else None
    if considerations is not None:
        considerations.install()
    sys.argv = ["gpupool", "sim", "replay", *replay_args]
    status: object = 0
    try:
        gpupool_main()
    except SystemExit as exc:
        status = exc.code
    finally:
        replay_module.Replay._batch = batch  # type: ignore[method-assign]
        replay_module.cycle_on = cycle_on
        if considerations is not None:
            considerations.remove()
    total = sum(r[1] for r in rows.values()) or 1.0
    ordered = sorted(rows.items(), key=lambda kv: -kv[1][1])
    cycles = sum(r[0] for r in rows.values())
    table = Table(title=f"cycles by what woke them and what they decided ({cycles:,})")
    for column in ("woken by", "decided", "cycles", "CPU s", "share", "pending (mean)"):
        table.add_column(column, justify="left" if column in ("woken by", "decided") else "right")
    for (by, decided), (count, spent, pending) in ordered:
        table.add_row(by, decided, f"{count:,}", f"{spent:.1f}", f"{100 * spent / total:.1f} %",
                      f"{pending / count:.0f}")
    Console().print(table)
    Console().print(f"Woken by arrivals alone after a cycle that admitted and stopped nothing, and "
                    f"deciding what carrying that cycle's verdicts would: {repeated[0]:,} cycles, "
                    f"{repeated[1]:.1f} s ({100 * repeated[1] / total:.1f} % of the cycles' CPU).")
    by_outcome = considerations.report(total) if considerations is not None else None
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "replay_args": replay_args,
        "considerations": by_outcome,
        "rows": [{"woken_by": by, "decided": decided, "cycles": count, "cpu_s": spent,
                  "share": spent / total, "pending_mean": pending / count}
                 for (by, decided), (count, spent, pending) in ordered],
        "repeats": {"cycles": repeated[0], "cpu_s": repeated[1], "share": repeated[1] / total},
    }, indent=2))
    return status if isinstance(status, int) else 1 if status else 0


if __name__ == "__main__":
    raise SystemExit(main())
