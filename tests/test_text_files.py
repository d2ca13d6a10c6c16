"""Every CSV file gpupool reads (traces, node lists, request traces, profiles) that is gzip-compressed
or not UTF-8 is one sentence naming the file, before any row is read; a configuration file has an
end (a device named by mistake is refused, not read without end)."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.config import load_config
from gpupool.errors import InvalidInput
from gpupool.providers.nodespec import nodes_from_openb_csv
from gpupool.sim.serving.profiles import read_perf_csv
from gpupool.sim.serving.trace import load_azure
from gpupool.sim.traces.openb import load_openb_pods
from gpupool.sim.traces.philly import load_philly

READERS: dict[str, Callable[[Path], object]] = {
    "philly": load_philly,
    "openb pods": load_openb_pods,
    "openb nodes": nodes_from_openb_csv,
    "azure requests": load_azure,
    "splitwise profiles": read_perf_csv,
}


@pytest.mark.parametrize("reader", list(READERS))
def test_a_compressed_or_latin1_csv_is_one_sentence(reader: str, tmp_path: Path) -> None:
    text = "name,value\ncaf\u00e9,1\n"
    packed, latin = tmp_path / "t.csv.gz", tmp_path / "t.csv"
    packed.write_bytes(gzip.compress(text.encode()))
    latin.write_bytes(text.encode("latin-1"))
    for path, said in ((packed, "it is gzip-compressed; decompress it first (gunzip -k"),
                       (latin, "it is not UTF-8 text (byte 0xe9 on line 2)")):
        with pytest.raises(InvalidInput) as caught:
            READERS[reader](path)
        assert said in caught.value.message and str(path) in caught.value.message, caught.value.message


def test_a_configuration_file_without_end_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpupool.config as config

    monkeypatch.setattr(config, "MAX_CONFIG_FILE_BYTES", 64)
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * 100 + "\n")
    with pytest.raises(InvalidInput, match="holds more than 0 MiB, far more than a configuration needs"):
        load_config(big)
    with pytest.raises(InvalidInput, match="far more than a configuration needs"):
        load_config("/dev/zero")


def test_a_profile_row_cut_short_is_one_sentence(tmp_path: Path) -> None:
    from gpupool.sim.serving.profiles import PERF_COLUMNS

    cut = tmp_path / "perf.csv"
    cut.write_text(",".join(PERF_COLUMNS) + "\nllama,A100,1,128\n")
    with pytest.raises(InvalidInput, match=r"perf.csv:2: a number column does not hold a number \(or"):
        read_perf_csv(cut)
