"""What a command says it wrote is the file it wrote: a plot or drawing named without a suffix is written
at that name (a PNG), not at the name with .png added, and a name is printed as given, never read as
rich markup ("[b]" dropped) nor wrapped at the terminal's width."""

from __future__ import annotations

import os
from pathlib import Path

from cli_inproc import run_cli
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.write import to_ibnetdiscover
from serving_factories import write_profile, write_trace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ENV = {**os.environ, "COLUMNS": "40"}  # narrower than any of the lines below
PNG = b"\x89PNG\r\n\x1a\n"


def _only(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_fabric_draw_writes_and_names_the_file_it_was_given(tmp_path: Path) -> None:
    topo = tmp_path / "tree.topo"
    topo.write_text(to_ibnetdiscover(fat_tree(4)))
    out = tmp_path / "out" / "[b]drawing"
    done = run_cli(["fabric", "draw", str(topo), "--out", str(out)], ENV)
    assert (done.returncode, done.stdout) == (0, f"Wrote {out}\n"), (done.stdout, done.stderr)
    assert _only(out.parent) == ["[b]drawing"] and out.read_bytes()[:8] == PNG


def test_fabric_generate_names_the_file_as_given(tmp_path: Path) -> None:
    out = tmp_path / "[b]tree[/b].topo"
    done = run_cli(["fabric", "generate", "fat-tree", "--ports", "4", "--out", str(out)], ENV)
    assert (done.returncode, done.stderr) == (0, f"Wrote {out}\n"), (done.stdout, done.stderr)
    assert out.is_file()


def test_sim_fill_names_the_files_it_wrote(tmp_path: Path) -> None:
    json_out, plot = tmp_path / "runs[b].json", tmp_path / "[red]allocation"
    done = run_cli(["sim", "fill", "--nodes", str(FIXTURES / "openb" / "nodes.csv"), "--pods",
                    str(FIXTURES / "openb" / "pods.csv"), "--seed", "42", "--json", str(json_out),
                    "--plot", str(plot)], ENV)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.splitlines()[-2:] == [f"JSON written to {json_out}", f"Plot written to {plot}"]
    assert _only(tmp_path) == ["[red]allocation", "runs[b].json"] and plot.read_bytes()[:8] == PNG


def test_sim_replay_and_serve_write_a_plot_without_a_suffix_at_its_name(tmp_path: Path) -> None:
    replay, serve = tmp_path / "replay" / "plot", tmp_path / "serve" / "plot"
    philly = FIXTURES / "replay" / "philly_tiny.csv"
    done = run_cli(["sim", "replay", "--cluster", "2x8xV100M32", "--trace", f"philly:{philly}", "--json",
                    str(replay.parent / "r.json"), "--plot", str(replay)], ENV)
    assert done.returncode == 0, (done.stdout, done.stderr)
    serve.parent.mkdir()
    trace = write_trace(tmp_path / "conv.csv", [(0.5 * i, 300, 5) for i in range(8)])
    profiles = write_profile(tmp_path / "perf.csv")
    done = run_cli(["sim", "serve", "--trace", f"azure-conv:{trace}", "--profiles", str(profiles),
                    "--cluster", "2x8xH100", "--plot", str(serve)], ENV)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert _only(replay.parent) == ["plot", "r.json"] and _only(serve.parent) == ["plot"]
    assert replay.read_bytes()[:8] == serve.read_bytes()[:8] == PNG
