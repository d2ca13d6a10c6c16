"""`gpupool up` raises its soft limit of open files to the hard one (cli/up.py): with the common
soft limit of 1024, one tenant's followed streams could take every descriptor of the server."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import resource, sys
from gpupool.cli.up import raise_open_files_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
said = raise_open_files_limit()
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], repr(said))
"""


def _probe(soft: int, hard: int) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", PROBE, str(soft), str(hard)], capture_output=True,
                          text=True, check=True)
    raised, said = done.stdout.split(" ", 1)
    return int(raised), said.strip()


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    assert _probe(256, 9000) == (9000, "''")


def test_a_low_hard_limit_is_said_with_how_to_raise_it() -> None:
    raised, said = _probe(256, 2048)
    assert raised == 2048
    assert "may hold only 2048 files open" in said and "LimitNOFILE=" in said
