"""A workload's checkpoint over the API (what a federation hub carries between members): submitted
held, a checkpoint is given before its first run only; it is read back as a tar with its mark, 304
while the mark has not moved, and a body past the limit is refused before it is read whole."""

from __future__ import annotations

import io
import os
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import ManualProvider
from sqlalchemy import select

from conftest import Server, start_server, stop_server
from factories import node
from gpupool.agent.checkpoints import CheckpointDirs, unpack
from gpupool.server.orm import WorkloadRow


class CheckpointingProvider(ManualProvider):
    """ManualProvider with checkpoint directories on this machine (as the local provider's)."""

    def __init__(self, scratch: Path) -> None:
        super().__init__([node("n0", devices=8, model="H100")])
        self.dirs = CheckpointDirs(scratch)
        self.seeded: list[tuple[str, bool]] = []
        """(workload id, on_behalf) of each checkpoint given: the account its files are owned by."""

    def checkpoint_s(self, workload_id: str) -> float | None:
        return self.dirs.mark_s(workload_id)

    def read_checkpoint(self, workload_id: str, max_bytes: int) -> tuple[float | None, bytes] | None:
        return self.dirs.archive(workload_id, max_bytes)

    def seed_checkpoint(self, workload_id: str, tenant: str, unix_user: str, data: bytes, *,
                        on_behalf: bool = False) -> int:
        self.seeded.append((workload_id, on_behalf))
        return self.dirs.seed(workload_id, None, data)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    served = start_server(tmp_path, provider=CheckpointingProvider(tmp_path / "scratch"))
    made = served.client.post("/api/v1/tenants", json={"name": "team"}, headers=served.headers())
    assert made.status_code == 201, made.text
    yield served
    stop_server(served)


SPEC = {"command": ["train"], "resources": {"gpus": 1}, "tenant": "team"}


def _tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_a_held_submission_takes_a_checkpoint_once_and_reads_it_back(server: Server) -> None:
    api, h = server.client, server.headers()
    held = api.post("/api/v1/workloads", params={"hold": "true"}, json=SPEC,
                    headers=h).json()["id"]
    shown = api.get(f"/api/v1/workloads/{held}", headers=h).json()
    assert (shown["status"], shown["held"]) == ("pending", "admin")
    assert api.get(f"/api/v1/workloads/{held}/checkpoint", headers=h).status_code == 204  # none yet
    data = _tar({"state": b"step-41", ".checkpoint": b""})
    put = api.put(f"/api/v1/workloads/{held}/checkpoint", content=data, headers=h)
    assert put.status_code == 200, put.text
    assert "Given a checkpoint of 7 bytes" in put.json()["message"]
    again = api.put(f"/api/v1/workloads/{held}/checkpoint", content=data, headers=h)
    assert again.status_code == 409 and "already has a checkpoint" in again.json()["message"]
    got = api.get(f"/api/v1/workloads/{held}/checkpoint", headers=h)
    assert got.status_code == 200 and got.headers["content-type"] == "application/x-tar"
    mark = float(got.headers["X-Gpupool-Checkpoint-Mark"])
    assert mark == 1_700_000_000
    with tarfile.open(fileobj=io.BytesIO(got.content)) as archive:
        assert archive.extractfile("state").read() == b"step-41"  # type: ignore[union-attr]
    assert api.get(f"/api/v1/workloads/{held}/checkpoint", params={"since_s": mark},
                   headers=h).status_code == 304
    assert api.get(f"/api/v1/workloads/{held}/checkpoint", params={"max_bytes": 3},
                   headers=h).status_code == 413


def test_only_the_tenant_gives_or_reads_the_checkpoint_of_its_own_work_and_files_follow_the_account(
        server: Server) -> None:
    """A checkpoint's files are read by the pods as they start (a pickle runs code as it loads): the
    admin or a hub gives one only to work it submitted, which runs as the tenant's on-behalf account,
    and the files are owned by that account; the tenant's own held work takes one from its own token
    only, owned by its own account."""
    api, admin = server.client, server.headers()
    token = api.post("/api/v1/tokens", json={"tenant": "team"}, headers=admin).json()["token"]
    own = {"Authorization": f"Bearer {token}"}
    provider = server.rt.provider
    assert isinstance(provider, CheckpointingProvider)
    theirs = api.post("/api/v1/workloads", params={"hold": "true"}, json=SPEC, headers=own).json()["id"]
    data = _tar({"state": b"step-41", ".checkpoint": b""})
    refused = api.put(f"/api/v1/workloads/{theirs}/checkpoint", content=data, headers=admin)
    assert refused.status_code == 403, refused.text
    assert refused.json()["message"] == (
        f"Workload {theirs} was submitted with one of tenant team's own tokens and runs as its account; a "
        "checkpoint from the admin could run code there (a pickle loads as it reads). Put it with one of "
        "team's tokens.")
    assert provider.seeded == []
    assert api.put(f"/api/v1/workloads/{theirs}/checkpoint", content=data, headers=own).status_code == 200
    admins = api.post("/api/v1/workloads", params={"hold": "true"}, json=SPEC, headers=admin).json()["id"]
    assert api.put(f"/api/v1/workloads/{admins}/checkpoint", content=data, headers=admin).status_code == 200
    assert provider.seeded == [(theirs, False), (admins, True)]
    read = api.get(f"/api/v1/workloads/{theirs}/checkpoint", headers=admin)  # what its pods wrote
    assert read.status_code == 403 and "read with one of team's tokens only" in read.json()["message"]
    assert api.get(f"/api/v1/workloads/{theirs}/checkpoint", headers=own).status_code == 200
    assert api.get(f"/api/v1/workloads/{admins}/checkpoint", headers=admin).status_code == 200
    with server.rt.store.read() as session:
        stored = {row.id: row.spec.get("on_behalf") for row in session.scalars(select(WorkloadRow))}
    assert stored == {theirs: None, admins: "admin"}


def test_a_checkpoint_larger_than_the_request_body_limit_is_taken_whole(server: Server) -> None:
    """A checkpoint (up to 256 MiB) has room past the pool's limit for other bodies (1 MiB by
    default): the hub's PUT of one over 1 MiB was refused (413) and the moved work started over."""
    api, h = server.client, server.headers()
    assert server.rt.settings.max_request_body_bytes == 2**20
    weights = os.urandom(3 * 2**20)
    held = api.post("/api/v1/workloads", params={"hold": "true"}, json=SPEC, headers=h).json()["id"]
    put = api.put(f"/api/v1/workloads/{held}/checkpoint", headers=h,
                  content=_tar({"weights": weights, ".checkpoint": b""}))
    assert put.status_code == 200, put.text
    got = api.get(f"/api/v1/workloads/{held}/checkpoint", headers=h)
    with tarfile.open(fileobj=io.BytesIO(got.content)) as archive:
        assert archive.extractfile("weights").read() == weights  # type: ignore[union-attr]
    other = api.post("/api/v1/workloads", json={**SPEC, "env": {"X": "x" * (2**20)}}, headers=h)
    assert other.status_code == 413  # the other routes' limit stands


def test_a_checkpoint_is_refused_for_work_not_held_or_a_bad_archive(server: Server) -> None:
    api, h = server.client, server.headers()
    free = api.post("/api/v1/workloads", json=SPEC, headers=h).json()["id"]
    refused = api.put(f"/api/v1/workloads/{free}/checkpoint", content=_tar({"a": b"1"}), headers=h)
    assert refused.status_code == 409 and "not held" in refused.json()["message"]
    held = api.post("/api/v1/workloads", params={"hold": "true"}, json=SPEC,
                    headers=h).json()["id"]
    bad = api.put(f"/api/v1/workloads/{held}/checkpoint", content=b"not a tar" * 200, headers=h)
    assert bad.status_code == 422 and "not a tar archive" in bad.json()["message"]
    escape = api.put(f"/api/v1/workloads/{held}/checkpoint", content=_tar({"../x": b"1"}), headers=h)
    assert escape.status_code == 422 and "not a plain file" in escape.json()["message"]


def _tar_of(*entries: tuple[str, bytes | None]) -> bytes:
    """A tar of (name, contents) in order, repeats kept; None contents make a directory."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size, info.mtime = len(data), 1_700_000_000
                archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize("entries,repeated", [
    ((("state", b"x"), ("state", b"y")), "state"),  # the same file twice
    ((("d", None), ("d", None)), "d"),  # the same directory twice
    ((("d", None), ("d/w", b"1"), ("d/w", b"2")), "d/w"),  # twice inside a directory
    ((("d", b"x"), ("d", None)), "d"),  # a file, then a directory of that name
])
def test_a_checkpoint_with_a_repeated_name_is_refused_and_a_valid_one_still_taken(
        server: Server, entries: tuple[tuple[str, bytes | None], ...], repeated: str) -> None:
    api, h = server.client, server.headers()
    held = api.post("/api/v1/workloads", params={"hold": "true"}, json=SPEC,
                    headers=h).json()["id"]
    refused = api.put(f"/api/v1/workloads/{held}/checkpoint", content=_tar_of(*entries), headers=h)
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["code"] == "invalid_input"
    assert f"{repeated!r} more than once" in body["message"] and "without the repeat" in body["message"]
    good = api.put(f"/api/v1/workloads/{held}/checkpoint",  # nothing left behind: not a 409
                   content=_tar_of(("d", None), ("d/w", b"ok"), (".checkpoint", b"")), headers=h)
    assert good.status_code == 200, good.text
    got = api.get(f"/api/v1/workloads/{held}/checkpoint", headers=h)
    with tarfile.open(fileobj=io.BytesIO(got.content)) as archive:
        assert archive.extractfile("d/w").read() == b"ok"  # type: ignore[union-attr]


def test_an_unpack_cut_short_removes_what_it_wrote(tmp_path: Path) -> None:
    target = tmp_path / "t"
    target.mkdir()
    (target / "z").symlink_to(tmp_path / "outside")  # writing "z" fails after "a" and "a/b" are written
    with pytest.raises(FileExistsError):
        unpack(target, _tar_of(("a", None), ("a/b", b"12"), ("c", b"3"), ("z", b"4")), None, None)
    assert sorted(p.name for p in target.iterdir()) == ["z"]  # only what was there before
    assert not (tmp_path / "outside").exists()


class GatedProvider(CheckpointingProvider):
    """Each checkpoint read waits for `gate` (counted in `reading` while it does)."""

    def __init__(self, scratch: Path) -> None:
        super().__init__(scratch)
        self.gate = threading.Event()
        self.reading = 0
        self._lock = threading.Lock()

    def read_checkpoint(self, workload_id: str, max_bytes: int) -> tuple[float | None, bytes] | None:
        with self._lock:
            self.reading += 1
        assert self.gate.wait(30), "the gate was never opened"
        return super().read_checkpoint(workload_id, max_bytes)


def test_checkpoint_reads_are_bounded_for_each_tenant_and_for_the_server(tmp_path: Path) -> None:
    """A read builds its archive in the server's memory (up to twice 256 MiB): one tenant's many reads
    at once asked for gigabytes. One of each tenant's and two in all run at once; more are refused
    (429, nothing done), and a slot comes back when its read is answered."""
    provider = GatedProvider(tmp_path / "scratch")
    server = start_server(tmp_path, provider=provider)
    try:
        api, admin = server.client, server.headers()
        held, tokens = {}, {}
        for tenant in ("team", "other", "third"):
            assert api.post("/api/v1/tenants", json={"name": tenant}, headers=admin).status_code == 201
            made = api.post("/api/v1/tokens", json={"tenant": tenant}, headers=admin)
            tokens[tenant] = made.json()["token"]
            held[tenant] = api.post("/api/v1/workloads", params={"hold": "true"},
                                    json={**SPEC, "tenant": tenant}, headers=admin).json()["id"]
            put = api.put(f"/api/v1/workloads/{held[tenant]}/checkpoint",
                          content=_tar({"state": tenant.encode(), ".checkpoint": b""}), headers=admin)
            assert put.status_code == 200, put.text

        def read(tenant: str) -> Any:
            return api.get(f"/api/v1/workloads/{held[tenant]}/checkpoint",
                           headers=server.headers(tokens[tenant]))

        answers: dict[str, Any] = {}

        def reading(tenant: str, count: int) -> threading.Thread:
            thread = threading.Thread(target=lambda: answers.update({tenant: read(tenant)}))
            thread.start()
            server.wait_for(lambda: provider.reading == count)
            return thread

        first = reading("team", 1)
        again = read("team")
        assert again.status_code == 429 and again.headers["Retry-After"] == "1"
        assert "Tenant team has 1 checkpoint transfers under way" in again.json()["message"]
        put = api.put(f"/api/v1/workloads/{held['team']}/checkpoint", content=_tar({"x": b"1"}),
                      headers=server.headers(tokens["team"]))
        assert put.status_code == 429, put.text  # a write is a transfer too, refused before it is read
        second = reading("other", 2)
        third = read("third")
        assert third.status_code == 429
        assert "This server has 2 checkpoint transfers" in third.json()["message"]
        provider.gate.set()
        first.join(30)
        second.join(30)
        for tenant in ("team", "other"):
            assert answers[tenant].status_code == 200
            with tarfile.open(fileobj=io.BytesIO(answers[tenant].content)) as archive:
                assert archive.extractfile("state").read() == tenant.encode()  # type: ignore[union-attr]
        assert read("team").status_code == read("third").status_code == 200  # the slots came back
        assert provider.reading == 4  # the refused reads never reached the provider
    finally:
        stop_server(server)
