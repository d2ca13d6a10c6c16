"""Issue 38 item 6: `--topology` and `-o` refused in the style of every other option: one line naming
the option, what it takes, and the value meant (did-you-mean), never pydantic's "value error". Both
are refused before any request, so no server is needed."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from cli.cliproc import one_line_error

NOWHERE = "http://127.0.0.1:9"  # never reached: the arguments are refused first


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "GPUPOOL_URL": NOWHERE, "GPUPOOL_TOKEN": "x", "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "gpupool.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("args", "says"), [
    (["ls", "-o", "jsn"], "Error: --output must be table, wide, json or name (got jsn); did you mean json?"),
    (["node", "ls", "-o", "YAML"], "Error: --output must be table, wide, json or name (got YAML)."),
    (["audit", "-o", "wid"],
     "Error: --output must be table, wide, json or name (got wid); did you mean wide?"),
    (["usage", "-o", "cvs"], "Error: --output must be table, json or csv (got cvs); did you mean csv?"),
    (["show", "w-1", "-o", "jason"],
     "Error: --output must be table, wide, json or name (got jason); did you mean json?"),
])
def test_a_bad_output_format_is_one_sentence_with_the_choices(args: list[str], says: str) -> None:
    line = one_line_error(cli(*args), 2, "Error: --output")
    assert line == says and "value error" not in line.lower()


@pytest.mark.parametrize(("topology", "says"), [
    ("required=spne", "Error: Option --topology got 'required=spne': unknown topology tier 'spne' in "
                      "required= (did you mean spine?); use leaf or spine."),
    ("requird=leaf", "Error: Option --topology got 'requird=leaf': unknown topology key 'requird' (did you "
                     "mean required?); use required, preferred, slice or comm."),
    ("spine", "Error: Option --topology got 'spine': cannot read topology 'spine' (did you mean "
              "preferred=spine or required=spine?); write required=leaf|spine, preferred=leaf|spine, "
              "slice=N@leaf|spine, comm=RATIO (comma-joined) or none."),
    ("comm=lots", "Error: Option --topology got 'comm=lots': comm= needs a number such as comm=1.5, got "
                  "'lots'."),
])
def test_a_bad_topology_is_said_of_the_option(topology: str, says: str) -> None:
    line = one_line_error(cli("submit", "--replicas", "2", "--topology", topology, "--", "train"), 2,
                          "Error: Option --topology")
    assert line == says and "Field 'topology'" not in line


def test_help_paragraphs_are_reflowed_to_the_terminal() -> None:
    """A docstring's source line breaks are not kept: at 80 columns each one left a short line."""
    shown = cli("node", "ls", "--help")
    assert shown.returncode == 0, shown.stderr
    text = " ".join(line.strip(" │") for line in shown.stdout.splitlines())
    assert "drained (draining and nothing left running)" in text
    lines = [line.rstrip() for line in shown.stdout.splitlines()]
    assert all(len(line) <= 80 for line in lines)
    prose = [line for line in lines if not line.startswith(("╭", "│", "╰"))]  # blank lines kept
    broken = [a for a, b in itertools.pairwise(prose) if a.strip() and b.strip() and len(a) < 50]
    assert broken == [], broken  # a line cut short inside a paragraph
