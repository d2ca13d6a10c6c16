"""A rolling upgrade on one store, with real code of both releases: a server of the code just before
the newest migration keeps serving (submit, run, cancel, list) while this code migrates the store
under it, and this code's server then finds everything both wrote.

The old code is taken from the repository's own history (`git archive` of the commit before the one
that added the newest migration) and run from a temporary directory first on PYTHONPATH; without
the history (an archive, a shallow clone) the test skips, saying so.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from upproc import UpProcess, until

from gpupool.server.db import MIGRATIONS_DIR, Store
from gpupool.server.schema import current_revision, head_revision, script_directory

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def _old_source(into: Path) -> tuple[str, str]:
    """Unpack src/ of the commit before the newest migration into `into`; (that commit, its head)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed, and the old release's code comes from the history")
    newest = script_directory().get_revision(head_revision())
    path = Path(newest.path).resolve().relative_to(ROOT)
    try:
        added = _git("log", "-1", "--format=%H", "--", str(path))
        old = _git("rev-parse", f"{added}^1")
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", old, "src"], capture_output=True,
                                 check=True, timeout=120).stdout
    except (subprocess.CalledProcessError, ValueError) as exc:
        pytest.skip(f"the repository's history is not here ({exc}); the old release's code comes from it")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    versions = sorted(p.name.split("_", 1)[0]
                      for p in (into / "src/gpupool/server/migrations/versions").glob("0*.py"))
    return old, versions[-1]


@pytest.fixture
def old_code(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    source = tmp_path / "old"
    _commit, old_head = _old_source(source)
    assert old_head != head_revision() and (MIGRATIONS_DIR / "versions").is_dir()
    yield source / "src", old_head


def test_an_old_server_keeps_serving_while_the_new_code_migrates_its_store(
        tmp_path: Path, old_code: tuple[Path, str]) -> None:
    old_src, old_head = old_code
    data = tmp_path / "data"
    url = f"sqlite:///{data / 'gpupool.sqlite'}"
    old = UpProcess(data, ["--simulate", "1x8xH100"], env={"PYTHONPATH": str(old_src)}).start()
    new: UpProcess | None = None
    try:
        with old.client() as api:
            assert api.post("/tenants", json={"name": "team"}).status_code == 201
            before = api.post("/workloads", json={"command": ["true"], "tenant": "team"}).json()["id"]
        store = Store.open(url, migrate=False)
        assert current_revision(store.engine) == old_head  # the old code made the store
        store.close()

        Store.open(url).close()  # this code migrates the store under the running old server
        store = Store.open(url, migrate=False)
        assert current_revision(store.engine) == head_revision()
        store.close()

        with old.client() as api:  # and the old server goes on: submits, runs, cancels, lists
            after = api.post("/workloads", json={"command": ["true"], "tenant": "team"}).json()["id"]
            held = api.post("/workloads", json={"command": ["sleep", "600"], "tenant": "team"}).json()["id"]
            for wid in (before, after):
                until(lambda wid=wid: api.get(f"/workloads/{wid}").json()["status"] == "succeeded",
                      60, f"{wid} succeeded on the old server")
            until(lambda: api.get(f"/workloads/{held}").json()["status"] == "running", 60, "running")
            assert api.post(f"/workloads/{held}/cancel").status_code == 200
            until(lambda: api.get(f"/workloads/{held}").json()["status"] == "cancelled", 60, "cancelled")
            listed = {w["id"] for w in api.get("/workloads").json()["items"]}
            assert {before, after, held} <= listed
        assert "Traceback" not in old.log_text(), old.log_text()[-3000:]
        old.stop()

        new = UpProcess(data, ["--simulate", "1x8xH100"]).start()  # this release on the same store
        with new.client() as api:
            statuses = {w["id"]: w["status"] for w in api.get("/workloads").json()["items"]}
        assert statuses == {before: "succeeded", after: "succeeded", held: "cancelled"}
    finally:
        old.stop()
        if new is not None:
            new.stop()
