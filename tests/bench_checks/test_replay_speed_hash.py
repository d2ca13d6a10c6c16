"""bench/replay_speed.py's result hash: equal for two replays that decided the same (the timings
left out), different when any other figure differs, in any key order."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import replay_speed  # noqa: E402

RESULT = {"jobs": 10, "jct_s": {"mean": 12.5, "p99": 40.0}, "reservations": {"slides": 3},
          "wall_s": 101.3, "cycle_ms_mean": 2.1}


def test_the_timings_do_not_count() -> None:
    other = dict(RESULT, wall_s=95.7, cycle_ms_mean=1.7)
    assert replay_speed.result_hash(other) == replay_speed.result_hash(RESULT)
    assert len(replay_speed.result_hash(RESULT)) == 16


def test_any_other_figure_counts_and_key_order_does_not() -> None:
    moved = dict(RESULT, reservations={"slides": 4})
    assert replay_speed.result_hash(moved) != replay_speed.result_hash(RESULT)
    reordered = dict(reversed(list(RESULT.items())))
    assert replay_speed.result_hash(reordered) == replay_speed.result_hash(RESULT)


def test_the_files_count_by_name_not_by_folder() -> None:
    """Each run of the script writes the fabric and the --config file into a temporary folder of its
    own: the same replay from another folder hashes alike, another file or option does not."""
    config = {"fabric": "run-1/tree.topo", "config_file": "run-1/moves.yaml", "backfill": True}
    first = dict(RESULT, config=config)
    elsewhere = dict(RESULT, config=dict(config, fabric="run-2/tree.topo", config_file="run-2/moves.yaml"))
    assert replay_speed.result_hash(elsewhere) == replay_speed.result_hash(first)
    for changed in ({"fabric": "run-1/other.topo"}, {"config_file": None}, {"backfill": False}):
        assert replay_speed.result_hash(dict(RESULT, config=dict(config, **changed))) \
            != replay_speed.result_hash(first), changed
