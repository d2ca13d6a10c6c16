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
