"""bench/replay_cycles.py: every cycle of the replay counted once, in a row named by what woke it and
what it decided, and the replay's own result the same as without the wrapper."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests" / "fixtures" / "replay" / "philly_tiny.csv"
REPLAY = ["--trace", f"philly:{TRACE}", "--cluster", "1x8xV100M32", "--seed", "1", "--ordering", "drf",
          "--policy", "first-fit", "--preemption", "--backfill"]


def _timings_left_out(path: Path) -> dict:
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in ("wall_s", "cycle_ms_mean")}


def test_every_cycle_is_counted_once_and_no_decision_changes(tmp_path: Path) -> None:
    wrapped, plain, rows = tmp_path / "wrapped.json", tmp_path / "plain.json", tmp_path / "rows.json"
    bench = [sys.executable, str(ROOT / "bench" / "replay_cycles.py"), "--json", str(rows)]
    done = subprocess.run([*bench, "--", *REPLAY, "--json", str(wrapped)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "cycles by what woke them" in done.stdout
    cli = [sys.executable, "-c", "from gpupool.cli.main import main; main()"]
    subprocess.run([*cli, "sim", "replay", *REPLAY, "--json", str(plain)], check=True, capture_output=True,
                   timeout=300)
    assert _timings_left_out(wrapped) == _timings_left_out(plain)
    found = json.loads(rows.read_text())["rows"]
    assert sum(r["cycles"] for r in found) == json.loads(plain.read_text())["cycles"] > 0
    assert abs(sum(r["share"] for r in found) - 1.0) < 1e-9
    assert {r["woken_by"] for r in found} == {"arrivals", "finishes"}
    assert any(r["decided"] == "admissions" for r in found)


def test_without_replay_arguments_it_says_what_to_give() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "replay_cycles.py")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert "give the replay's arguments after --" in done.stderr


def test_a_quiet_cycle_repeats_the_one_before_only_when_every_verdict_and_the_reservation_do() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import replay_cycles
    from gpupool.core.model import Reason
    from gpupool.core.scheduling.cycle import Admit, CycleResult, Reserve, Wait

    keys = {"a": "k1", "b": "k1", "c": "k2", "new": "k1", "other": "k3"}
    full = (Reason.NO_NODE_FITS, "No node fits.")
    behind = (Reason.BACKFILL_BLOCKED, "Starting now would delay the reserved head.")

    def quiet(*decisions: object) -> replay_cycles.Quiet:
        found = replay_cycles.quiet_of(CycleResult(tuple(decisions)), keys.__getitem__)  # type: ignore[arg-type]
        assert found is not None
        return found

    before = quiet(Wait("a", *full), Wait("b", *full), Wait("c", *behind), Reserve("a", 100.0))
    same = quiet(Wait("a", *full), Wait("b", *full), Wait("c", *behind), Wait("new", *full),
                 Reserve("a", 100.0))
    assert replay_cycles.repeats(before, same, keys.__getitem__)
    for changed in (
        quiet(Wait("a", *full), Wait("b", *full), Wait("c", *full), Reserve("a", 100.0)),  # c's verdict
        quiet(Wait("a", *full), Wait("b", *full), Wait("c", *behind), Reserve("a", 130.0)),  # the start
        quiet(Wait("a", *full), Wait("b", *full), Wait("c", *behind), Wait("new", *behind),
              Reserve("a", 100.0)),  # the newcomer's key had another verdict
        quiet(Wait("a", *full), Wait("b", *full), Wait("c", *behind), Wait("other", *full),
              Reserve("a", 100.0)),  # the newcomer's key had none
    ):
        assert not replay_cycles.repeats(before, changed, keys.__getitem__)
    assert replay_cycles.quiet_of(CycleResult((Admit("a", ()),)), keys.__getitem__) is None


def test_considerations_are_timed_without_changing_a_decision(tmp_path: Path) -> None:
    """`--considerations`: every consideration counted in one row, the shares within the cycles' time,
    and the replay's result the same as without the wrapper."""
    wrapped, plain, rows = tmp_path / "wrapped.json", tmp_path / "plain.json", tmp_path / "rows.json"
    bench = [sys.executable, str(ROOT / "bench" / "replay_cycles.py"), "--considerations",
             "--json", str(rows)]
    done = subprocess.run([*bench, "--", *REPLAY, "--json", str(wrapped)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    cli = [sys.executable, "-c", "from gpupool.cli.main import main; main()"]
    subprocess.run([*cli, "sim", "replay", *REPLAY, "--json", str(plain)], check=True, capture_output=True,
                   timeout=300)
    assert _timings_left_out(wrapped) == _timings_left_out(plain)
    found = json.loads(rows.read_text())["considerations"]
    kinds = {r["kind"]: r for r in found["considerations by what came of them"]}
    assert kinds["admitted"]["count"] > 0 and kinds["waited, otherwise"]["count"] > 0
    assert sum(r["share"] for r in kinds.values()) + found["outside_considerations_share"] == \
        pytest.approx(1.0)
    assert 0.0 <= found["carry_ceiling_share"] <= 1.0 - found["outside_considerations_share"] + 1e-9


def test_a_consideration_is_named_by_what_came_of_it() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import replay_cycles
    from gpupool.core.model import Reason
    from gpupool.core.scheduling.cycle import Admit, EventKind, Refuse, Stop, Wait

    full = (Reason.NO_NODE_FITS, "No node fits.")
    kind = replay_cycles.consideration_kind
    assert kind([Wait("a", *full)], False, full) == ("waited, as its key last did", full)
    assert kind([Wait("a", *full)], False, None) == ("waited, otherwise", full)
    assert kind([Wait("a", *full)], False, (Reason.NO_NODE_FITS, "Another message.")) == \
        ("waited, otherwise", full)
    assert kind([Refuse("a", *full)], False, full) == ("waited, as its key last did", full)
    assert kind([Wait("a", *full)], True, full) == ("reserved for (the head)", None)
    assert kind([Admit("a", ())], False, full)[0] == "admitted"
    stop = Stop("v", EventKind.PREEMPT, Reason.PREEMPTED, "Preempted.")
    assert kind([stop, Admit("a", ())], False, None)[0] == "preempted its way in"
    assert kind([], False, full) == ("other", None)
