"""The Philly loader: rows become jobs; malformed rows name file:line and what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.errors import InvalidInput, TraceError
from gpupool.sim.jobs import in_window, parse_window, philly_jobs
from gpupool.sim.traces.philly import load_philly

FIXTURE = Path(__file__).parents[1] / "fixtures" / "replay" / "philly_tiny.csv"
HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


def test_loads_rows_in_file_order() -> None:
    jobs = load_philly(FIXTURE)
    assert len(jobs) == 6
    assert (jobs[0].num_gpus, jobs[0].duration_s, jobs[0].tenant, jobs[0].line) == (4, 600.0, "teamA", 2)
    assert jobs[1].submit_s - jobs[0].submit_s == 60.0


def test_large_jobs_become_gangs_of_node_sized_pods() -> None:
    jobs = {j.workload.name: j for j in philly_jobs(FIXTURE, devices_per_node=8, seed=0)}
    assert [p.num_devices for p in jobs["16gpu"].workload.pods] == [8, 8]
    assert jobs["4gpu"].workload.tenant == "teamA"


def test_window_by_dates() -> None:
    jobs = philly_jobs(FIXTURE, 8, 0)
    assert len(in_window(jobs, parse_window("2017-10-01:2017-10-02"))) == 5
    with pytest.raises(InvalidInput, match="ends before it starts"):
        parse_window("2017-10-02:2017-10-01")
    with pytest.raises(InvalidInput, match="START:END"):
        parse_window("yesterday")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2017-13-01 00:00:00,1,1,1,a", "timestamp must look like"),
        ("2017-10-01 00:00:00,abc,1,1,a", "duration must be a number"),
        ("2017-10-01 00:00:00,-5,1,1,a", "duration must be a finite number >= 0"),
        ("2017-10-01 00:00:00,5,0,1,a", "num_gpus must be a whole number >= 1"),
        ("2017-10-01 00:00:00,5,1.5,1,a", "num_gpus must be a whole number >= 1"),
        ("2017-10-01 00:00:00,5,1,1,", r"cluster \(the tenant\) is empty"),
        ("2017-10-01 00:00:00,5,1", "expected 5 fields"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(HEADER + "2017-10-01 00:00:00,5,1,5,ok\n" + row + "\n")
    with pytest.raises(TraceError, match=message) as info:
        load_philly(path)
    assert f"{path}:3:" in info.value.message


def test_missing_column_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("timestamp,duration\n")
    with pytest.raises(TraceError, match="lacks column"):
        load_philly(path)
    with pytest.raises(InvalidInput, match="does not exist"):
        load_philly(tmp_path / "nope.csv")
