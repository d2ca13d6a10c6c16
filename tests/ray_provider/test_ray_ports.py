"""A Ray node's ports are chosen free, then closed, then bound by Ray's processes seconds later: one
taken in between (an outbound connection's source port, another program) makes the node start
again with fresh ports at once, instead of Ray waiting 35-40 s for the component that never came
and failing."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray provider needs Ray (pip install 'gpupool[ray]')")

from gpupool.providers.ray import cluster
from gpupool.providers.ray.settings import ensure_token

GCS = len(cluster.AGENT_PORTS)
"""Where the head's own port (its GCS) sits among those free_ports chooses for it."""


class Taker:
    """free_ports whose first `times` choices have their GCS port taken by a listening socket right
    after it is chosen, as another process would take it."""

    def __init__(self, real: Callable[..., list[int]], stack: ExitStack) -> None:
        self.real, self.stack = real, stack
        self.times = 0
        self.choices: list[list[int]] = []

    def __call__(self, count: int, host: str = "127.0.0.1") -> list[int]:
        ports = self.real(count, host)
        self.choices.append(ports)
        if len(self.choices) <= self.times:
            self.stack.enter_context(socket.create_server(("127.0.0.1", ports[GCS])))
        return ports


@pytest.fixture
def taker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Taker]:
    with ExitStack() as stack:
        made = Taker(cluster.free_ports, stack)
        monkeypatch.setattr(cluster, "free_ports", made)
        yield made


def test_a_head_whose_port_was_taken_starts_again_on_fresh_ports(tmp_path: Path, taker: Taker) -> None:
    taker.times = 1
    head = cluster.start_head(ensure_token(tmp_path / "ray-token"))
    try:
        assert len(taker.choices) == 2, "the head started again once"
        assert head.address.endswith(f":{taker.choices[1][GCS]}"), head.address
    finally:
        head.stop()


def test_a_port_taken_at_every_try_says_so(tmp_path: Path, taker: Taker) -> None:
    taker.times = cluster.START_TRIES
    with pytest.raises(cluster.PortTaken) as refused:
        cluster.start_head(ensure_token(tmp_path / "ray-token"))
    assert len(taker.choices) == cluster.START_TRIES
    assert str(refused.value).startswith("Ray did not start: another process took a port it was given (")


def test_only_the_logs_of_the_processes_given_ports_count(tmp_path: Path) -> None:
    """Ray's monitor tries a fixed metrics port, taken whenever another head runs on the machine,
    and runs on without it: its complaint is no reason to start again (a clean-clone run, with the
    package's cluster up beside a test's head, failed two heads on it)."""
    logs = tmp_path / "session_1" / "logs"
    logs.mkdir(parents=True)
    node = object.__new__(cluster.RayProcess)
    node.temp_dir = tmp_path
    (logs / "monitor.log").write_text("OSError: [Errno 98] Address already in use\n")
    (logs / "dashboard.log").write_text("OSError: [Errno 98] Address already in use\n")
    assert node.port_taken() == ""
    (logs / "gcs_server.err").write_text("UNKNOWN:Failed to add any wildcard listeners\n")
    assert node.port_taken() == "gcs_server.err: Failed to add any wildcard listeners"
