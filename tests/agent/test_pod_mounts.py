"""Mounts and secret files in a pod's own mount namespace (agent/mounts.py, the launcher helper).

A pod sees its mounts at their targets and its secrets under /run/secrets; the node sees neither;
a source that leads outside its root (a symlink), or that the pod's account may not reach, is
refused with a sentence; another tenant's pod cannot read the secret file. Needs root (mount
namespaces and pod accounts), as `make test` runs in CI; skips elsewhere with the reason.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from factories import pod_python
from gpupool.agent.identity import account_name
from gpupool.pods import PodLaunch, PodMount, PodPhase, PodSecret, PodStatus
from gpupool.providers.local import LocalProvider

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces and pod accounts need root")

SECRET_VALUE = b"tok-8b1f0c-value"


def wait_final(provider: LocalProvider, pod_id: str, timeout_s: float = 20.0) -> PodStatus:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = {s.pod_id: s for s in provider.poll()}.get(pod_id)
        if status is not None and status.phase.is_final:
            return status
        time.sleep(0.02)
    raise AssertionError(f"{pod_id} did not finish")


def run(provider: LocalProvider, pod_id: str, script: str, *, tenant: str = "team-a",
        mounts: tuple[PodMount, ...] = (), secrets: tuple[PodSecret, ...] = ()) -> tuple[PodStatus, str]:
    provider.launch(PodLaunch(pod_id=pod_id, workload_id="w-" + pod_id, node=provider.agent.node_name,
                              tenant=tenant,
                              command=(pod_python(), "-c", script), mounts=mounts, secrets=secrets))
    status = wait_final(provider, pod_id)
    return status, provider.read_log(pod_id).text


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProvider]:
    p = LocalProvider(tmp_path_factory.mktemp("agent"), simulate="1xH100", node_name="box")
    yield p
    p.close(stop_pods=True)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An allowed root (open to every account, as a shared data directory is) with a data set, a
    private corner of another account, and a symlink that leads out of it."""
    base = tmp_path_factory.mktemp("mounts")
    root = base / "data"
    (root / "set").mkdir(parents=True)
    (root / "set" / "part-0").write_text("rows\n")
    (root / "closed" / "inner").mkdir(parents=True)
    (base / "outside").mkdir()
    (base / "outside" / "key").write_text("not yours\n")
    (root / "escape").symlink_to(base / "outside")
    (root / "inside-link").symlink_to(root / "set")
    for path in (root, root / "set", root / "closed" / "inner", base / "outside"):
        path.chmod(0o755)
    (root / "set" / "part-0").chmod(0o644)
    (root / "closed").chmod(0o700)  # root's own: no pod account may enter
    return root


READ = "import os; print(open('/mnt/part-0').read().strip()); print(sorted(os.listdir('/mnt')))"


def test_a_mount_shows_the_source_at_its_target_read_only(provider: LocalProvider, data: Path) -> None:
    script = READ + """
try:
    open('/mnt/new', 'w')
    print('wrote')
except OSError as exc:
    print('refused', exc.errno)
"""
    status, out = run(provider, "m-ro", script,
                      mounts=(PodMount(str(data / "set"), "/mnt", True, str(data)),))
    assert status.phase is PodPhase.SUCCEEDED, (status, out)
    assert out.split("\n")[:3] == ["rows", "['part-0']", "refused 30"]  # EROFS
    assert not (data / "set" / "new").exists()
    assert not os.path.ismount("/mnt") or "part-0" not in os.listdir("/mnt")  # the node's /mnt is untouched


def test_a_symlink_inside_the_root_is_followed(provider: LocalProvider, data: Path) -> None:
    status, out = run(provider, "m-link", READ,
                      mounts=(PodMount(str(data / "inside-link"), "/mnt", True, str(data)),))
    assert status.phase is PodPhase.SUCCEEDED, (status, out)
    assert out.startswith("rows\n")


@pytest.mark.parametrize(("source", "said"), [
    ("escape", "leads outside the allowed root"),
    ("closed/inner", "may not enter a directory on the way"),
    ("missing", "does not exist on this node"),
])
def test_a_source_that_escapes_or_hides_is_refused(provider: LocalProvider, data: Path, source: str,
                                                   said: str) -> None:
    from gpupool.errors import InvalidInput

    with pytest.raises(InvalidInput, match=said):
        provider.launch(PodLaunch(pod_id=f"m-bad-{source.replace('/', '-')}", workload_id="w", node="box",
                                  tenant="team-a", command=("true",),
                                  mounts=(PodMount(str(data / source), "/mnt", True, str(data)),)))


def test_a_missing_target_fails_the_pod_with_the_reason(provider: LocalProvider, data: Path) -> None:
    status, _ = run(provider, "m-notarget", "print('ran')",
                    mounts=(PodMount(str(data / "set"), "/no/such/dir", True, str(data)),))
    assert status.phase is PodPhase.FAILED
    assert "the target must exist on the node" in status.message


def test_a_target_through_a_symlink_is_refused(provider: LocalProvider, data: Path) -> None:
    """A tenant can plant a symlink on the node (in /tmp, say, to /proc) and name it as a target:
    the root mount call would follow it (covering /proc, through which a later bind takes its
    source). The launcher opens targets without following symlinks and fails the pod instead; here
    the link leads to the harmless /mnt, where a followed bind would simply have worked."""
    link = data.parent / "to-mnt"
    link.symlink_to("/mnt")
    status, out = run(provider, "m-target-link", "print('ran')",
                      mounts=(PodMount(str(data / "set"), str(link), True, str(data)),))
    assert status.phase is PodPhase.FAILED, (status, out)
    assert f"cannot mount on {link}" in status.message and "symbolic link" in status.message


def test_secrets_reach_the_pod_by_variable_and_by_file_and_nothing_else(provider: LocalProvider) -> None:
    script = """
import json, os
info = os.stat('/run/secrets/api/token')
print(json.dumps({'env': os.environ.get('API_TOKEN'), 'file': open('/run/secrets/api/token').read(),
                  'mode': oct(info.st_mode & 0o777), 'mine': info.st_uid == os.getuid(),
                  'keys': sorted(os.listdir('/run/secrets/pair')), 'pid': os.getpid()}))
"""
    secrets = (PodSecret("api", env="API_TOKEN", data={"token": SECRET_VALUE}),
               PodSecret("api", path="/run/secrets/api/token", data={"token": SECRET_VALUE}),
               PodSecret("pair", path="/run/secrets/pair", data={"user": b"u", "password": b"p"}))
    status, out = run(provider, "s-ok", script, secrets=secrets)
    assert status.phase is PodPhase.SUCCEEDED, (status, out)
    seen = json.loads(out)
    assert seen["env"] == seen["file"] == SECRET_VALUE.decode()
    assert seen["mode"] == "0o400" and seen["mine"]
    assert seen["keys"] == ["password", "user"]
    assert not os.path.exists("/run/secrets/api")  # only in the pod's own namespace
    assert SECRET_VALUE not in repr(secrets).encode()  # a launch's repr (a log line) holds no value
    state = Path(provider.agent.runner.pod_dir("s-ok"))
    for path in state.rglob("*"):  # the agent's records of the pod (its logs are what it printed)
        if path.is_file() and path.suffix != ".log":
            assert SECRET_VALUE not in path.read_bytes(), path


def test_another_tenants_pod_cannot_read_the_secret_file(provider: LocalProvider) -> None:
    """The owner's pod holds its secret file open; a pod of another tenant tries every way in: the
    owner's namespace through /proc/PID/root, and the node's /run/secrets."""
    owner = """
import os, sys, time
print(os.getpid(), flush=True)
while not os.path.exists('/tmp/gpupool-mounts-test-done'):
    time.sleep(0.05)
"""
    provider.launch(PodLaunch(pod_id="s-owner", workload_id="w-owner", node="box", tenant="team-a",
                              command=(pod_python(), "-c", owner),
                              secrets=(PodSecret("api", path="/run/secrets/token",
                                                 data={"token": SECRET_VALUE}),)))
    deadline = time.monotonic() + 20
    while not provider.read_log("s-owner").text.strip() and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = int(provider.read_log("s-owner").text.split()[0])
    thief = f"""
import os
for path in ('/proc/{pid}/root/run/secrets/token', '/run/secrets/token'):
    try:
        print(path, open(path).read())
    except OSError as exc:
        print(path, 'refused', exc.errno)
"""
    try:
        status, out = run(provider, "s-thief", thief, tenant="team-b")
    finally:
        Path("/tmp/gpupool-mounts-test-done").write_text("")
    try:
        assert status.phase is PodPhase.SUCCEEDED, (status, out)
        assert SECRET_VALUE.decode() not in out
        assert out.count("refused") == 2, out
        assert account_name("team-b") != account_name("team-a")
        assert wait_final(provider, "s-owner").phase is PodPhase.SUCCEEDED
    finally:
        os.unlink("/tmp/gpupool-mounts-test-done")


def test_a_deleted_secret_refuses_the_pod_with_a_sentence(provider: LocalProvider) -> None:
    from gpupool.errors import InvalidInput

    with pytest.raises(InvalidInput, match="secret 'gone' no longer exists"):
        provider.launch(PodLaunch(pod_id="s-gone", workload_id="w", node="box", tenant="team-a",
                                  command=("true",), secrets=(PodSecret("gone", env="X"),)))


def test_a_secret_path_that_climbs_out_of_the_tmpfs_is_refused(provider: LocalProvider) -> None:
    """The API refuses such a path; the launcher, root while it writes, refuses it again."""
    status, _ = run(provider, "s-climb", "print('ran')",
                    secrets=(PodSecret("x", path="/run/secrets/../escaped", data={"k": b"v"}),))
    assert status.phase is PodPhase.FAILED and "not a plain path below /run/secrets" in status.message
    assert not Path("/run/escaped").exists()


@pytest.mark.parametrize("target", ["/", "/proc/self", "/run", "/mnt/../proc", "relative"])
def test_a_target_the_api_would_refuse_is_refused_by_the_node_too(provider: LocalProvider, data: Path,
                                                                   target: str) -> None:
    from gpupool.errors import InvalidInput

    with pytest.raises(InvalidInput, match="must be a plain absolute path outside /proc"):
        provider.launch(PodLaunch(pod_id=f"m-t-{abs(hash(target))}", workload_id="w", node="box",
                                  tenant="team-a", command=("true",),
                                  mounts=(PodMount(str(data / "set"), target, True, str(data)),)))


def test_a_pod_with_its_own_network_namespace_gets_its_mounts_and_secrets_too(
        tmp_path: Path, data: Path) -> None:
    """The helper's child joins the pod's network namespace, then unshares its mount namespace."""
    import ipaddress

    from gpupool.agent import netns
    from gpupool.agent.netns import NetnsMode, NetworkSettings

    why = netns.probe()
    if why:
        pytest.skip(f"no pod network namespaces here: {why}")
    # a pod network of this file's own: test files that run at once never share one
    network = NetworkSettings(mode=NetnsMode.ON, pod_network=ipaddress.IPv4Network("10.239.0.0/16"))
    provider = LocalProvider(tmp_path / "agent", simulate="1xH100", node_name="box-net", network=network)
    try:
        if not provider.agent.network.active:
            pytest.skip(f"no pod network namespaces here: {provider.agent.network.unavailable}")
        script = ("import os; print(open('/run/secrets/t').read(), open('/mnt/part-0').read().strip(), "
                  "os.readlink('/proc/self/ns/net') != NODE_NET)").replace(
                      "NODE_NET", repr(os.readlink("/proc/self/ns/net")))
        status, out = run(provider, "net-1", script,
                          mounts=(PodMount(str(data / "set"), "/mnt", True, str(data)),),
                          secrets=(PodSecret("t", path="/run/secrets/t", data={"k": b"v"}),))
        assert status.phase is PodPhase.SUCCEEDED, (status, out)
        assert out.split() == ["v", "rows", "True"]
    finally:
        provider.close(stop_pods=True)
