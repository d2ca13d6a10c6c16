"""A plot (`sim fill|replay|serve --plot`, `fabric draw --out`) is written in the format its name's suffix
says: a suffix no plot is written in is refused with one sentence listing those there are, exit 2,
before the run (no JSON is written either), never matplotlib's traceback once the work is done."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cli_inproc import run_cli
from gpupool.cli._common import PLOT_FORMATS, check_plot_path
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.write import to_ibnetdiscover
from gpupool.errors import InvalidInput
from serving_factories import write_profile, write_trace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LISTED = "end the name in .png, .svg, .pdf, .eps, .jpg or .jpeg."


def _command(name: str, tmp: Path, plot: Path, out: Path) -> list[str]:
    if name == "fill":
        return ["sim", "fill", "--nodes", str(FIXTURES / "openb" / "nodes.csv"), "--pods",
                str(FIXTURES / "openb" / "pods.csv"), "--seed", "42", "--json", str(out), "--plot", str(plot)]
    if name == "replay":
        return ["sim", "replay", "--cluster", "2x8xV100M32", "--trace",
                f"philly:{FIXTURES / 'replay' / 'philly_tiny.csv'}", "--json", str(out), "--plot", str(plot)]
    if name == "serve":
        trace = write_trace(tmp / "conv.csv", [(0.5 * i, 300, 5) for i in range(8)])
        profiles = write_profile(tmp / "p.csv")
        return ["sim", "serve", "--trace", f"azure-conv:{trace}", "--profiles", str(profiles),
                "--cluster", "2x8xH100", "--json", str(out), "--plot", str(plot)]
    topo = tmp / "tree.topo"
    topo.write_text(to_ibnetdiscover(fat_tree(4)))
    return ["fabric", "draw", str(topo), "--out", str(plot)]


@pytest.mark.parametrize("name", ["fill", "replay", "serve", "draw"])
def test_a_plot_name_of_no_image_format_is_refused_before_the_run(name: str, tmp_path: Path) -> None:
    plot, out = tmp_path / "plot.txt", tmp_path / "out.json"
    done = run_cli(_command(name, tmp_path, plot, out), {**os.environ, "COLUMNS": "200"})
    flag = "--out" if name == "draw" else "--plot"
    said = f"Error: {flag} '{plot}' ends in .txt, not a format a plot can be written in; {LISTED}"
    assert (done.returncode, done.stderr.strip()) == (2, said), (done.returncode, done.stdout, done.stderr)
    assert not plot.exists() and not out.exists()  # nothing ran


def test_every_format_offered_is_one_matplotlib_writes(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1])
    for suffix in PLOT_FORMATS:
        path = tmp_path / f"plot.{suffix.upper()}"
        check_plot_path(path, "--plot")  # accepted, in either case
        fig.savefig(path)
        assert path.stat().st_size > 0
    plt.close(fig)
    check_plot_path(None, "--plot")
    check_plot_path(tmp_path / "plot", "--plot")  # no suffix: a PNG
    with pytest.raises(InvalidInput, match=r"ends in \.topo"):
        check_plot_path(tmp_path / "fabric.topo", "--out")
