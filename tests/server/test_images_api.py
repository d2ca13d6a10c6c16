"""The image routes and `--image` at submit, against a hand-driven provider: the admin imports and
removes, every token lists, a submit naming an image the pool lacks (or on a pool whose nodes cannot
run containers) is refused with a sentence, and a placed pod carries its image's root filesystem."""

from __future__ import annotations

import dataclasses
import io
import tarfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fakes import ManualProvider

from conftest import Server, start_server, stop_server
from factories import node
from gpupool.providers.nodespec import CONTAINERS_LABEL

API = "/api/v1"


def _archive() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("etc/os-release")
        info.size = 10
        archive.addfile(info, io.BytesIO(b"NAME=tiny\n"))
    return buffer.getvalue()


def _server(tmp_path: Path, *, containers: bool) -> Server:
    box = node("n0", devices=2, model="H100")
    if containers:
        box = replace(box, labels={CONTAINERS_LABEL: "crun 1.8.1"})
    server = start_server(tmp_path / "data", provider=ManualProvider([box]))
    server.rt.settings = dataclasses.replace(server.rt.settings, image_dir=tmp_path / "images")
    return server


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[tuple[Server, str]]:
    server = _server(tmp_path, containers=True)
    server.created("/tenants", {"name": "team-a"})
    token = str(server.created("/tokens", {"tenant": "team-a", "name": "t"})["token"])
    yield server, token
    stop_server(server)


def _import(server: Server, name: str, body: bytes, token: str | None = None) -> object:
    return server.client.post(f"{API}/images", params={"name": name}, content=body,
                              headers=server.headers(token))


def test_the_admin_imports_and_removes_and_every_token_lists(pool: tuple[Server, str]) -> None:
    server, tenant = pool
    answer = _import(server, "tiny", _archive())
    assert answer.status_code == 201, answer.text  # type: ignore[attr-defined]
    listed = server.client.get(f"{API}/images", headers=server.headers(tenant)).json()
    assert [(i["name"], i["source"], i["files"]) for i in listed] == [("tiny", "rootfs", 1)]
    refused = _import(server, "mine", _archive(), tenant)
    assert refused.status_code == 403, refused.text  # type: ignore[attr-defined]
    assert server.client.delete(f"{API}/images/tiny", headers=server.headers(tenant)).status_code == 403
    audit = server.client.get(f"{API}/audit", headers=server.headers()).json()
    assert [a["action"] for a in audit if a["action"].startswith("image.")] == ["image.import"]
    assert server.client.delete(f"{API}/images/tiny", headers=server.headers()).status_code == 200
    gone = server.client.delete(f"{API}/images/tiny", headers=server.headers())
    assert gone.status_code == 404 and "No image 'tiny'" in gone.json()["message"]


def _tar(*members: tuple[str, bytes | None, str]) -> bytes:
    """(name, data or None for a link, what a link names) members, in order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data, linked in members:
            info = tarfile.TarInfo(name)
            if data is None:
                symbolic = linked.startswith("@")
                info.type = tarfile.SYMTYPE if symbolic else tarfile.LNKTYPE
                info.linkname = linked.lstrip("@")
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _oci(layer_member: tuple[str, bytes | None, str] | None) -> bytes:
    """An OCI image layout whose manifest names layer sha256:bb, held as `layer_member` (None: absent)."""
    manifest = b'{"layers": [{"digest": "sha256:bb"}]}'
    index = b'{"manifests": [{"digest": "sha256:aa"}]}'
    members = [("oci-layout", b"{}", ""), ("index.json", index, ""), ("blobs/sha256/aa", manifest, "")]
    return _tar(*members, *([layer_member] if layer_member else []))


@pytest.mark.parametrize(("name", "body", "sentence"), [
    ("Bad/Name", _archive(), "is not valid: an image's name holds"),
    ("junk", b"not a tar" * 100, "it is not a readable tar archive"),
    ("nolayer", _oci(None), "its manifest names layer 'blobs/sha256/bb', which the archive does not hold"),
    ("linkedlayer", _oci(("blobs/sha256/bb", None, "@aa")), "layer blobs/sha256/bb is not a file"),
    ("dangling", _tar(("bin/sh", None, "bin/busybox")), "a hard link to 'bin/busybox', which is not in the"),
], ids=["name", "junk", "oci-layer-missing", "oci-layer-a-link", "hard-link-to-nothing"])
def test_a_bad_import_is_one_sentence(pool: tuple[Server, str], name: str, body: bytes,
                                      sentence: str) -> None:
    server, _ = pool
    answer = _import(server, name, body)
    assert answer.status_code == 422 and sentence in answer.json()["message"], answer.text  # type: ignore


def test_a_submit_in_an_image_the_pool_lacks_is_refused_naming_those_it_has(pool: tuple[Server, str]) -> None:
    server, tenant = pool
    spec = {"command": ["true"], "image": "nope"}
    answer = server.client.post(f"{API}/workloads", json=spec, headers=server.headers(tenant))
    assert answer.status_code == 422 and "it has none yet" in answer.json()["message"], answer.text
    _import(server, "tiny", _archive())
    _import(server, "other", _archive())
    answer = server.client.post(f"{API}/workloads", json=spec, headers=server.headers(tenant))
    assert answer.status_code == 422, answer.text
    assert "No image 'nope' in this pool: it has other, tiny;" in answer.json()["message"]


def test_a_malformed_image_name_at_submit_says_what_a_name_may_hold(pool: tuple[Server, str]) -> None:
    server, tenant = pool
    answer = server.client.post(f"{API}/workloads", json={"command": ["true"], "image": "Bad/Name"},
                                headers=server.headers(tenant))
    assert answer.status_code == 422, answer.text
    assert "an image's name holds 1-63 lower-case letters" in answer.json()["message"]


@pytest.mark.parametrize("extra", [
    {"mounts": [{"source": "/srv/data", "target": "/data"}]},
    {"secrets": [{"name": "key", "path": "/run/secrets/key"}]},
])
def test_binds_that_cannot_reach_into_a_container_are_refused_at_submit(
        pool: tuple[Server, str], extra: dict[str, object]) -> None:
    server, tenant = pool
    _import(server, "tiny", _archive())
    answer = server.client.post(f"{API}/workloads", json={"command": ["true"], "image": "tiny", **extra},
                                headers=server.headers(tenant))
    assert answer.status_code == 422, answer.text
    assert "do not reach into a container yet" in answer.json()["message"]
    assert server.client.get(f"{API}/workloads", headers=server.headers(tenant)).json()["items"] == []


def test_a_placed_pod_carries_its_images_root_filesystem(pool: tuple[Server, str]) -> None:
    server, tenant = pool
    _import(server, "tiny", _archive())
    spec = {"command": ["true"], "image": "tiny"}
    answer = server.client.post(f"{API}/workloads", json=spec, headers=server.headers(tenant))
    assert answer.status_code == 201, answer.text
    server.wait_for(lambda: bool(server.provider.launched))
    launch = next(iter(server.provider.launched.values()))
    assert launch.image == "tiny" and launch.image_rootfs == str(server.rt.images.rootfs("tiny"))
    assert Path(launch.image_rootfs, "etc/os-release").read_text() == "NAME=tiny\n"


def test_an_image_in_use_is_not_replaced_under_its_work(pool: tuple[Server, str]) -> None:
    """The spec keeps the image's name and a launch looks the name up again: an import under the name
    of an image a tenant's running pod uses put the admin's root filesystem under the pod's next
    attempt, holding its secrets. Refused while work uses it; once it ended, replaced."""
    server, tenant = pool
    _import(server, "tiny", _archive())
    before = server.rt.images.get("tiny")
    spec = {"command": ["true"], "image": "tiny"}
    wid = server.client.post(f"{API}/workloads", json=spec, headers=server.headers(tenant)).json()["id"]
    refused = _import(server, "tiny", _tar(("bin/app", b"echo $HF_TOKEN\n", "file")))
    assert refused.status_code == 409, refused.text  # type: ignore[attr-defined]
    said = refused.json()["message"]  # type: ignore[attr-defined]
    assert f"Image 'tiny' is in use by pending or running work ({wid}): replacing it" in said
    assert server.rt.images.get("tiny") == before
    assert server.client.post(f"{API}/workloads/{wid}/cancel", headers=server.headers()).status_code == 200
    server.wait_for(lambda: server.status(wid) == "cancelled")
    assert _import(server, "tiny", _archive()).status_code == 201  # type: ignore[attr-defined]


def test_an_image_a_service_names_is_neither_replaced_nor_removed(pool: tuple[Server, str]) -> None:
    """A service starts a replica in its image whenever it scales up or rolls, from zero replicas too:
    a name replaced while no replica ran put the admin's root filesystem under the tenant's next
    replica, holding the service's secrets. Refused while a service names it; once deleted, replaced."""
    server, tenant = pool
    _import(server, "tiny", _archive())
    before = server.rt.images.get("tiny")
    made = server.client.post(f"{API}/services", headers=server.headers(tenant), json={
        "name": "chat", "command": ["serve"], "image": "tiny", "min_replicas": 0, "replicas": 0})
    assert made.status_code == 201, made.text
    refused = _import(server, "tiny", _tar(("bin/app", b"echo $HF_TOKEN\n", "file")))
    assert refused.status_code == 409, refused.text  # type: ignore[attr-defined]
    said = refused.json()["message"]  # type: ignore[attr-defined]
    assert "Image 'tiny' is in use by services (team-a/chat): replacing it would start their pods" in said
    assert server.rt.images.get("tiny") == before
    removed = server.client.delete(f"{API}/images/tiny", headers=server.headers())
    assert removed.status_code == 409 and "in use by services (team-a/chat)" in removed.json()["message"]
    gone = server.client.delete(f"{API}/services/chat", headers=server.headers(tenant))
    assert gone.status_code == 200, gone.text
    server.wait_for(lambda: server.client.get(f"{API}/services/chat", headers=server.headers(tenant)
                                              ).status_code == 404)
    assert _import(server, "tiny", _archive()).status_code == 201  # type: ignore[attr-defined]


def test_a_pool_whose_nodes_cannot_run_containers_refuses_image_work(tmp_path: Path) -> None:
    server = _server(tmp_path, containers=False)
    try:
        _import(server, "tiny", _archive())
        answer = server.client.post(f"{API}/workloads", json={"command": ["true"], "image": "tiny"},
                                    headers=server.headers())
        assert answer.status_code == 422, answer.text
        assert "No node of this pool can run containers" in answer.json()["message"]
        shown = server.client.get(f"{API}/nodes/n0", headers=server.headers()).json()
        assert shown["containers"].startswith("none: ")
    finally:
        stop_server(server)
