"""Fixtures for the fabric model tests: the committed InfiniBand topology files."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.core.fabric.model import Fabric
from gpupool.core.fabric.parse import parse_topology

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "infiniband"


def load(name: str) -> Fabric:
    return parse_topology((FIXTURES / name).read_text(), source=name)


@pytest.fixture(scope="session")
def psmn() -> Fabric:
    return load("psmn-X5-fattree.topofile")
