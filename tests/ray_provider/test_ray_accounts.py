"""The accounts a Ray pool's pods run as: the pool's own, `gpupool-<pool id>-<tenant>`, as a local
pool's, with the id the server gave its provider; the cluster keeps the first id published in it.

Shares the package's Ray cluster (conftest.pool, started with a pool id) and runs before
test_ray_pool.py, which kills nodes. The machine `gpupool node join` adds is checked there
(test_a_machine_joins_with_the_cli_runs_work_and_leaves).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray provider needs Ray (pip install 'gpupool[ray]')")

import ray.experimental.internal_kv

from gpupool.agent.identity import account_name
from gpupool.agent.netns import NETNS_ENV
from gpupool.core.model import Slice
from gpupool.errors import ProviderError
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.ray import RayProvider
from gpupool.providers.ray.join import POOL_ID_KEY, claim_pool_id, published_pool_id
from gpupool.providers.ray.settings import NAMESPACE, TOKEN_FILE

from .conftest import given_pool_id, wait_for

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="pods run as other accounts only under root")


def _final(provider: RayProvider, pod_id: str, timeout_s: float = 60.0) -> PodStatus:
    status = wait_for(lambda: (s := {p.pod_id: p for p in provider.poll()}[pod_id]).phase.is_final and s,
                      timeout_s, f"pod {pod_id} to end")
    assert isinstance(status, PodStatus)
    return status


def _whoami(provider: RayProvider, pod_id: str, node: str, tenant: str, *, on_behalf: bool = False) -> str:
    """The account a pod of `tenant` runs as on `node` (`id -un` in the pod)."""
    provider.launch(PodLaunch(pod_id=pod_id, workload_id=f"w-{pod_id}", node=node, command=("id", "-un"),
                              slices=(Slice(0, 250, 1024),), tenant=tenant, on_behalf=on_behalf))
    status = _final(provider, pod_id)
    assert (status.phase, status.exit_code) == (PodPhase.SUCCEEDED, 0), status
    return provider.read_log(pod_id).text.strip()


@as_root
def test_pods_run_as_the_pools_accounts_named_by_the_pool_id_given_to_the_provider(pool: RayProvider) -> None:
    pool_id = given_pool_id(pool)
    assert pool.pool_id == pool_id
    for node in pool.nodes():
        assert _whoami(pool, f"who-{node.name}", node.name, "acme") == f"gpupool-{pool_id}-acme"
    # work the admin or a hub started for the tenant: its on-behalf account, of the same pool
    assert _whoami(pool, "who-ob", "t4-000", "acme", on_behalf=True) == f"gpupool-{pool_id}-acme_ob"
    assert account_name("acme", pool_id, on_behalf=True) == f"gpupool-{pool_id}-acme_ob"


def test_the_cluster_keeps_the_first_pool_id_published_and_a_later_provider_uses_it(
        pool: RayProvider) -> None:
    pool_id = given_pool_id(pool)
    assert published_pool_id() == pool_id
    assert claim_pool_id("0ther1") == pool_id and claim_pool_id("") == pool_id
    assert published_pool_id() == pool_id, "a later claim never replaces the cluster's id"
    # another server of the pool (high availability), whose own data directory has another id
    second = RayProvider(pool.address, data_dir=pool.data_dir, pool_id="0ther2")
    try:
        assert second.pool_id == pool_id
        if os.geteuid() == 0:
            assert _whoami(second, "who-second", "t4-001", "acme") == f"gpupool-{pool_id}-acme"
            second.forget_pods(["who-second"])  # released: no later provider adopts it
    finally:
        second.close()


def test_a_server_on_the_cluster_names_its_pods_accounts_by_the_clusters_id(
        pool: RayProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.providers import registry
    from gpupool.server.provision import provision
    from gpupool.server.settings import Settings

    asked: dict[str, object] = {}
    make = registry.make_provider

    def make_provider(name: str, **options: object) -> object:
        asked.update(options)
        return make(name, **options)

    monkeypatch.setattr(registry, "make_provider", make_provider)
    monkeypatch.setenv(NETNS_ENV, "off")  # its provider would give the shared nodes pod network plans
    shutil.copy(pool.token_path, tmp_path / TOKEN_FILE)  # as an operator copies the head's token
    (tmp_path / TOKEN_FILE).chmod(0o600)
    own = Settings(data_dir=tmp_path, provider="ray", pool_id="5e1f00")
    provisioned = provision(own, ray_address=pool.address)
    try:
        assert asked["pool_id"] == "5e1f00", "the server gives its provider its own id"
        assert isinstance(provisioned.provider, RayProvider)
        assert provisioned.provider.pool_id == given_pool_id(pool)
        assert provisioned.pool_id == given_pool_id(pool), "the server is told the accounts are the cluster's"
    finally:
        provisioned.provider.close()


def test_gpupool_up_on_a_cluster_of_another_id_says_so_and_uses_it(pool: RayProvider, tmp_path: Path) -> None:
    """A second server of the pool (its own data directory, so its own id) runs its pods, and checks
    its tenants' mappings, as the cluster's accounts, and says so."""
    from ports import free_port

    data = tmp_path / "second"
    data.mkdir(mode=0o700)
    shutil.copy(pool.token_path, data / TOKEN_FILE)
    (data / TOKEN_FILE).chmod(0o600)
    (data / "pool-id").write_text("5e2f00\n")
    up = subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", "up", "--provider", "ray", "--port",
                           str(free_port()), "--ray-address", pool.address, "--data-dir", str(data)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, NETNS_ENV: "off"})  # the shared nodes keep their network
    said: list[str] = []
    deadline = threading.Timer(120.0, up.kill)  # a server that never says it serves ends the read
    deadline.start()
    try:
        assert up.stdout is not None
        for line in up.stdout:
            said.append(line)
            if "gpupool is serving" in line:
                break
    finally:
        deadline.cancel()
        up.terminate()
        up.wait(timeout=60)
    text = "".join(said)
    pool_id = given_pool_id(pool)
    assert f"Note: the Ray cluster's pool id is {pool_id} (published by the server that connected to it " \
           f"first), not this data directory's 5e2f00" in text, text
    if os.geteuid() == 0:
        assert f"Pods run as unprivileged accounts: gpupool-{pool_id}-<tenant>" in text, text
    assert (data / "pool-id").read_text() == "5e2f00\n", "the data directory keeps its own id"


@pytest.fixture
def kv(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[tuple[str, str], bytes]]:
    """Ray's internal KV of the pool id, as a dict (namespace, key) -> value, with its overwrite rule
    (other keys go to the real one: the package's provider may be reading its nodes meanwhile)."""
    store: dict[tuple[str, str], bytes] = {}
    real_put, real_get = (ray.experimental.internal_kv._internal_kv_put,
                          ray.experimental.internal_kv._internal_kv_get)

    def put(key: str, value: bytes, overwrite: bool = True, *, namespace: str) -> bool:
        if key != POOL_ID_KEY:
            return bool(real_put(key, value, overwrite, namespace=namespace))
        existed = (namespace, key) in store
        if overwrite or not existed:
            store[namespace, key] = value
        return existed

    def get(key: str, *, namespace: str) -> bytes:
        return store.get((namespace, key), b"") if key == POOL_ID_KEY else real_get(key, namespace=namespace)

    monkeypatch.setattr(ray.experimental.internal_kv, "_internal_kv_put", put)
    monkeypatch.setattr(ray.experimental.internal_kv, "_internal_kv_get", get)
    yield store


def test_a_cluster_with_no_pool_id_published_names_accounts_as_before(
        kv: dict[tuple[str, str], bytes]) -> None:
    assert published_pool_id() == ""  # a cluster whose server is older than pool ids: gpupool-<tenant>
    assert claim_pool_id("") == "" and not kv, "a provider given no id publishes none"
    assert claim_pool_id("a1b2c3") == "a1b2c3"
    assert kv == {(NAMESPACE, POOL_ID_KEY): b"a1b2c3"}
    assert claim_pool_id("d4e5f6") == "a1b2c3" and published_pool_id() == "a1b2c3"


def test_a_published_value_that_is_no_pool_id_is_refused(kv: dict[tuple[str, str], bytes]) -> None:
    kv[NAMESPACE, POOL_ID_KEY] = b"../root"
    with pytest.raises(ProviderError, match=r"is '\.\./root', not a pool id"):
        published_pool_id()
