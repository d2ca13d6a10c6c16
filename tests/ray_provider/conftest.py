"""One Ray cluster for the package's tests: a head and three simulated worker nodes, of a pool
with an id (its pods run as `gpupool-<pool id>-<tenant>` under root).

Starting Ray is slow (tens of seconds on a small machine), so the cluster is package-scoped and
every module here shares it (test_ray_pool.py, which kills nodes, runs last of those using it);
its temp dirs are /tmp/gpr-<pid>-<n>, removed on close.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from gpupool.providers.ray import RayProvider

FAST_HEALTH_CHECKS = {"RAY_health_check_initial_delay_ms": "0", "RAY_health_check_period_ms": "500",
                      "RAY_health_check_timeout_ms": "500", "RAY_health_check_failure_threshold": "3"}
"""So a killed node is declared dead in about two seconds, not Ray's default fifteen."""


def wait_for(check: Callable[[], object], timeout_s: float = 60.0, what: str = "condition") -> object:
    """Poll `check` until it returns something true; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def given_pool_id(pool: RayProvider) -> str:
    """The pool id the package's cluster was started with (its first provider's, in its data dir)."""
    return (pool.data_dir / "pool-id").read_text().strip()


@pytest.fixture(scope="package")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayProvider]:
    pytest.importorskip("ray", reason="the ray provider needs Ray (pip install 'gpupool[ray]')")
    from gpupool.providers.ray import RayProvider
    from gpupool.server.datadir import pool_id

    data_dir = tmp_path_factory.mktemp("raypool")
    # the pool's id as `gpupool up` makes it (DATA_DIR/pool-id, which the accounts' clean-up reads)
    provider = RayProvider(simulate="3x2xT4", data_dir=data_dir, head_env=FAST_HEALTH_CHECKS,
                           pool_id=pool_id(data_dir))
    try:
        yield provider
    finally:
        provider.close(stop_pods=True)
