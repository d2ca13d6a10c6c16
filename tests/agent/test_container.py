"""A pod's OCI config: its account's uid mapped to itself, only its own devices and directories, a
read-only root and no privilege; the runtime found on the node, or the sentence why none is."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpupool.agent import container
from gpupool.agent.container import POD_MOUNT_POINTS, ContainerRuntime

HYBRID = """\
25 1 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
30 25 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
35 25 0:30 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
"""
UNIFIED = "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"


def _config(**overrides: object) -> dict[str, object]:
    fields: dict[str, object] = dict(command=["python", "train.py"], env={"A": "1", "HOME": "/gpupool/home"},
                                     cwd="/gpupool/home", uid=931, gid=995, rootfs="/images/rootfs/abc")
    fields.update(overrides)
    return container.oci_config(**fields)  # type: ignore[arg-type]


def test_the_command_runs_as_the_pods_account_mapped_from_the_outer_namespaces_root() -> None:
    config = _config()
    process = config["process"]
    assert isinstance(process, dict)
    assert process["user"] == {"uid": 931, "gid": 995} and process["args"] == ["python", "train.py"]
    assert process["env"] == ["A=1", "HOME=/gpupool/home"] and process["cwd"] == "/gpupool/home"
    assert process["noNewPrivileges"] is True and not any(process["capabilities"].values())
    linux = config["linux"]
    assert isinstance(linux, dict)
    # 0 of the namespace `unshare --map-root-user` made is the account itself: nothing else is mapped
    assert linux["uidMappings"] == [{"containerID": 931, "hostID": 0, "size": 1}]
    assert linux["gidMappings"] == [{"containerID": 995, "hostID": 0, "size": 1}]
    kinds = {n["type"] for n in linux["namespaces"]}
    assert kinds == {"user", "mount", "ipc", "uts"}  # the pod's network namespace and pid space are kept
    assert config["root"] == {"path": "/images/rootfs/abc", "readonly": True}


def test_only_the_pods_directories_are_bound_and_only_at_the_images_mount_points() -> None:
    config = _config(binds={POD_MOUNT_POINTS["home"]: "/scratch/p-1", POD_MOUNT_POINTS["mps"]: ""},
                     read_only_binds={POD_MOUNT_POINTS["site"]: "/pkg/sitecustomize"})
    mounts = {m["destination"]: m for m in config["mounts"]}  # type: ignore[union-attr]
    home = mounts["/gpupool/home"]
    assert home["source"] == "/scratch/p-1" and "ro" not in home["options"]
    assert "ro" in mounts["/gpupool/site"]["options"] and "/gpupool/mps" not in mounts  # none: not bound
    assert mounts["/tmp"]["type"] == "tmpfs" and mounts["/sys"]["options"][-1] == "ro"
    binds = [m["source"] for m in mounts.values() if m["type"] == "none"]
    assert sorted(binds) == ["/pkg/sitecustomize", "/proc", "/scratch/p-1", "/sys"]
    with pytest.raises(ValueError, match="not one of the images' mount points"):
        _config(binds={"/etc": "/scratch/p-1"})


def test_a_pod_gets_its_own_gpus_device_nodes_and_no_other(tmp_path: Path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    nodes = container.gpu_device_nodes([2, 0], dev=tmp_path)
    assert nodes == [str(tmp_path / n) for n in ("nvidia0", "nvidia2", "nvidiactl", "nvidia-uvm")]
    assert container.gpu_device_nodes([], dev=tmp_path) == []  # no GPU: not even the control nodes
    config = _config(devices=nodes)
    devices = [m["source"] for m in config["mounts"] if m["source"].startswith(str(tmp_path))]  # type: ignore
    assert devices == nodes


def test_the_runtime_says_why_when_there_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert container.detect({container.RUNTIME_ENV: "off"}) == (
        None, "containers are turned off on this node (GPUPOOL_CONTAINER_RUNTIME=off)")
    runtime, why = container.detect({container.RUNTIME_ENV: "/nonexistent/crun"})
    assert runtime is None and "is not an executable" in why
    assert container._hybrid_cgroups(HYBRID) and not container._hybrid_cgroups(UNIFIED)


def test_the_wrapper_hides_the_v2_hierarchy_only_on_a_hybrid_host(tmp_path: Path) -> None:
    for hybrid, hidden in ((True, "/sys/fs/cgroup/unified"), (False, "")):
        runtime = ContainerRuntime("/usr/bin/crun", "/usr/bin/unshare", "/bin/mount", "1.8.1", hybrid)
        argv = container.container_argv(runtime, tmp_path / "bundle", "p-1")
        assert argv[:5] == ["/usr/bin/unshare", "--user", "--map-root-user", "--mount", "--"]
        assert argv[-6:] == [str(tmp_path / "bundle/state"), str(tmp_path / "bundle"), "p-1", hidden,
                             "/usr/bin/crun", "/bin/mount"]


def test_the_bundle_is_the_accounts_own(tmp_path: Path) -> None:
    uid, gid = os.geteuid(), os.getegid()
    bundle = container.write_bundle(tmp_path, _config(), uid, gid)
    assert (bundle / "config.json").stat().st_mode & 0o777 == 0o600 and (bundle / "state").is_dir()
    assert (bundle / "config.json").stat().st_uid == uid


def test_the_pools_sitecustomize_is_bound_from_a_copy_the_account_owns(tmp_path: Path) -> None:
    """crun runs as the pod's account, so what it binds must be the account's to reach: the package's
    own directory may lie under a path the account cannot enter (a 0700 checkout)."""
    from gpupool.agent.isolation import SITECUSTOMIZE_DIR
    from gpupool.agent.node import _site_copy

    home = tmp_path / "p-1"
    home.mkdir()
    site = _site_copy(home, 4321, 4321)
    assert site.parent == home
    names = sorted(p.name for p in SITECUSTOMIZE_DIR.glob("*.py"))
    assert names and sorted(p.name for p in site.iterdir()) == names
    for name in names:
        copy = site / name
        assert copy.read_bytes() == (SITECUSTOMIZE_DIR / name).read_bytes()
        if os.geteuid() == 0:
            assert (copy.stat().st_uid, copy.stat().st_gid) == (4321, 4321)


@pytest.mark.parametrize("planted", [".gpupool-site", ".gpupool-container", ".gpupool-container/state",
                                     ".gpupool-container/config.json", ".gpupool-site/sitecustomize.py"])
def test_a_symlink_planted_in_the_private_directory_is_not_followed(tmp_path: Path, planted: str) -> None:
    """The agent writes the image pod's sitecustomize copy and bundle as root into the pod's private
    directory, which the pod's account (and so a running pod of the same tenant, which can predict
    the next pod's id) may write to: a symlink planted under one of those names must not send root's
    writes, chmods and chowns to where it points."""
    from gpupool.agent.isolation import SITECUSTOMIZE_DIR
    from gpupool.agent.node import _site_copy

    home = tmp_path / "p-1"
    home.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"  # stands for /etc, the server's data directory, ...
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "config.json").write_text("keep")
    (elsewhere / "sitecustomize.py").write_text("keep")
    before = {p.name: (p.stat().st_mode, p.stat().st_uid, p.read_text()) for p in elsewhere.iterdir()}
    link = home / planted
    link.parent.mkdir(exist_ok=True)
    target = elsewhere / link.name if link.name in before else elsewhere
    link.symlink_to(target)
    uid, gid = (4321, 4321) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    site = _site_copy(home, uid, gid)
    bundle = container.write_bundle(home, _config(), uid, gid)
    assert {p.name: (p.stat().st_mode, p.stat().st_uid, p.read_text()) for p in elsewhere.iterdir()} == before
    assert (elsewhere.stat().st_mode & 0o777, elsewhere.stat().st_uid) == (0o700, os.geteuid())
    for made in (site, bundle, bundle / "state", bundle / "config.json",
                 *(site / p.name for p in SITECUSTOMIZE_DIR.glob("*.py"))):
        assert not made.is_symlink() and made.stat().st_uid == uid, made
    assert (site / "sitecustomize.py").read_bytes() == (SITECUSTOMIZE_DIR / "sitecustomize.py").read_bytes()
    assert json.loads((bundle / "config.json").read_text()) == _config()
