"""Optional provider features are declared in the contract (providers/base.py) with defaults, and the
server calls them on every provider instead of probing for them with getattr/hasattr."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

from gpupool.core.model import Node
from gpupool.pods import PodLaunch, PodStatus
from gpupool.providers.base import Provider
from gpupool.providers.fake import FakeProvider
from gpupool.providers.local import LocalProvider
from gpupool.providers.localpool import LocalPool

SRC = Path(__file__).resolve().parents[2] / "src" / "gpupool"


def _probes(path: Path) -> list[str]:
    """getattr/hasattr calls whose object is a provider (`provider`, `self.provider`, `rt.provider`...)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and node.args
                and "provider" in ast.unparse(node.args[0]).lower()):
            found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_server_never_probes_a_provider_for_a_feature() -> None:
    probes = [p for folder in ("server", "cli") for path in sorted((SRC / folder).rglob("*.py"))
              for p in _probes(path)]
    assert probes == [], "declare the feature in providers/base.py instead"


class _Minimal(Provider):
    """A provider with only what the contract requires."""

    name = "minimal-test"

    def __init__(self) -> None:
        self.launched: list[str] = []

    def nodes(self) -> list[Node]:
        return []

    def launch(self, pod: PodLaunch) -> None:
        self.launched.append(pod.pod_id)

    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        pass

    def poll(self) -> list[PodStatus]:
        return []


def test_a_provider_with_only_the_required_methods_gets_every_default() -> None:
    provider = _Minimal()
    calls: list[str] = []
    listener: Callable[[], None] = lambda: calls.append("exit")  # noqa: E731
    assert provider.concurrent_launch is False
    provider.add_exit_listener(listener)  # accepted, never called
    provider.forget_workload("w-1")
    provider.forget_pods(["p-1"])  # the acknowledgement: nothing to forget
    assert provider.checkpoint_marks(["w-1", "w-2"]) == {"w-1": None, "w-2": None}
    assert provider.health_events() == []
    assert provider.device_readings() == {}  # nothing measured: the dashboard says so
    assert provider.node_address("n1") == "127.0.0.1"
    assert calls == []


def test_the_providers_that_launch_in_parallel_say_so() -> None:
    assert LocalProvider.concurrent_launch is True
    assert LocalPool.concurrent_launch is True
    assert FakeProvider.concurrent_launch is False
    for cls in (LocalProvider, LocalPool):  # they report exits at once: their own listener method
        assert cls.add_exit_listener is not Provider.add_exit_listener
