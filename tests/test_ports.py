"""tests/ports.py: each pytest-xdist worker its own ports, below the ephemeral range."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

import ports
from gpupool.config import GangsConfig, ServingConfig


def _disjoint(slices: list[range]) -> set[int]:
    """Every port of `slices`, each slice 16 wide at least and sharing no port with another."""
    taken: set[int] = set()
    for each in slices:
        assert len(each) >= 16
        assert not taken & set(each)
        taken |= set(each)
    return taken


@pytest.mark.parametrize("count", [2, 4, 9, 18])
def test_each_worker_has_ports_of_its_own_that_no_outbound_connection_takes(count: int) -> None:
    slices = [ports.worker_slice("", count)] + [ports.worker_slice(f"gw{n}", count) for n in range(count)]
    taken = _disjoint(slices)
    assert max(taken) < ports.ephemeral_range()[0]
    assert max(taken) < ServingConfig().port_base  # nor a port the pool's replicas draw from
    assert min(taken) >= 1024


def test_an_ephemeral_range_starting_low_leaves_the_ports_above_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 49_151))
    slices = [ports.worker_slice(f"gw{n}", 4) for n in range(4)]
    assert min(slices[0]) > 49_151 and max(slices[-1]) <= 65_535
    assert len(set().union(*slices)) == sum(len(each) for each in slices)


def test_a_worker_finds_its_slice_without_the_count() -> None:
    # xdist sets PYTEST_XDIST_WORKER_COUNT; without it a worker's slice is the same for a few workers
    assert ports.worker_slice("gw3", 0) == ports.worker_slice("gw3", 4)


def test_more_workers_than_the_ports_fit_are_refused_with_a_sentence() -> None:
    with pytest.raises(RuntimeError, match="run fewer workers"):
        ports.worker_slice("gw0", 1000)


def test_a_held_port_is_passed_over() -> None:
    free = ports._Ports(ports.worker_slice("gw0", 4))
    held = free.ports[free.next]
    with socket.socket() as holder:
        try:
            holder.bind(("127.0.0.1", held))
        except OSError:
            pytest.skip(f"port {held} is held by another process here")
        assert free.take() != held


def test_no_port_is_handed_out_twice_before_the_slice_is_spent() -> None:
    free = ports._Ports(range(ports.BASE, ports.BASE + 40))
    bindable = [p for p in free.ports if ports._binds(p)]
    assert sorted(free.take() for _ in bindable) == bindable


def test_free_port_draws_from_this_workers_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_mine", None)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    assert ports.free_port() in ports.worker_slice("gw1", 4)


def test_no_test_names_a_port_from_a_port_0_bind() -> None:
    """The port-0 copies ports.py replaced stay gone: a test's server gets its port from ports.free_port."""
    tests = Path(__file__).parent
    found = []
    for path in tests.rglob("*.py"):
        if path.name == "test_ports.py":
            continue
        text = path.read_text()
        copy = re.search(r"def _?free_port", text) is not None
        pgtemp = "pgtemp.free_port" in text or "pgtemp import free_port" in text
        if path.name != "ports.py" and (copy or pgtemp):
            found.append(f"{path.relative_to(tests)}: a port-0 free_port")
        for call in re.finditer(r"(start_federation|pgtemp\.start)\((?:[^()]|\([^()]*\))*\)", text):
            if "free_port=" not in call.group(0):
                found.append(f"{path.relative_to(tests)}: {call.group(1)} without free_port=")
    assert found == []


@pytest.mark.parametrize("count", [2, 4, 9])
def test_each_workers_pools_give_their_replicas_ports_of_their_own(count: int) -> None:
    default = ServingConfig()
    slices = [ports.replica_slice("", count)] + [ports.replica_slice(f"gw{n}", count) for n in range(count)]
    taken = _disjoint(slices)
    assert min(taken) >= default.port_base and max(taken) < default.port_base + default.port_count
    assert not taken & set(ports.worker_slice("gw0", count))  # nor a port a test's server is given


def test_the_serving_config_keeps_a_pool_to_its_workers_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from gpupool.config import PoolConfig

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    serving = PoolConfig.model_validate(yaml.safe_load(ports.serving_config())).serving
    assert range(serving.port_base, serving.port_base + serving.port_count) == ports.replica_slice("gw1", 2)


@pytest.mark.parametrize("count", [2, 4, 9])
def test_each_workers_pools_give_their_gangs_ports_of_their_own(count: int) -> None:
    default = GangsConfig()
    slices = [ports.gang_slice("", count)] + [ports.gang_slice(f"gw{n}", count) for n in range(count)]
    taken = _disjoint(slices)
    assert min(taken) >= default.port_base and max(taken) < default.port_base + default.port_count
    others = [ports.worker_slice("", count), *(ports.worker_slice(f"gw{n}", count) for n in range(count)),
              ports.replica_slice("", count), *(ports.replica_slice(f"gw{n}", count) for n in range(count))]
    assert not taken & set().union(*others)  # nor a port a test's server or a replica is given
    assert max(taken) < ports.ephemeral_range()[0]


def test_more_workers_than_the_gang_ports_fit_are_refused_with_a_sentence() -> None:
    with pytest.raises(RuntimeError, match="gangs' 2000 ports, 16 each at least; run fewer workers"):
        ports.gang_slice("gw0", 200)


def test_the_gang_config_keeps_a_pool_to_its_workers_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from gpupool.config import PoolConfig

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    config = PoolConfig.model_validate(yaml.safe_load(ports.gang_config() + ports.serving_config()))
    assert config.gangs.ports() == ports.gang_slice("gw1", 2)
    assert range(config.serving.port_base, config.serving.port_base + config.serving.port_count) == (
        ports.replica_slice("gw1", 2))
