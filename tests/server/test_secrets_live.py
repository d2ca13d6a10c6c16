"""Mounts and per-tenant secrets through a real `gpupool up` and the `gpupool` CLI, with a hostile
second tenant.

team-a owns a secret and may mount from one read-only root; team-b (the attacker) may mount nothing.
team-a's pods get the secret as a variable and as a file and see the mount; team-b cannot read,
list, use, delete or guess team-a's secret (the same exit 3 and sentence as a secret that does not
exist) and cannot mount outside its roots. The secret's value appears nowhere but in team-a's pod:
not in the store file, the server's log, any API answer, nor the server's or launcher's environment.
Pods run as tenant accounts in their own mount namespaces, so this needs root; skips elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from upproc import UpProcess, cli

from factories import pod_python

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="tenant accounts and mount namespaces need root")]

VALUE = "hf_live_0d7e91c2b4a8"
DIGEST = hashlib.sha256(VALUE.encode()).hexdigest()
"""The pods print the digest, never the value: their logs are read back through the API."""


class Pool:
    def __init__(self, server: UpProcess, root: Path, tokens: dict[str, str]) -> None:
        self.server, self.root, self.tokens = server, root, tokens

    def gp(self, tenant: str, *args: str) -> tuple[int, str, str]:
        token = self.server.token() if tenant == "admin" else self.tokens[tenant]
        result = cli(list(args), {"GPUPOOL_URL": self.server.url, "GPUPOOL_TOKEN": token, "COLUMNS": "200"})
        return result.returncode, result.stdout, result.stderr

    def finished(self, tenant: str, workload_id: str) -> dict[str, object]:
        code, _, err = self.gp(tenant, "wait", workload_id, "--timeout", "60")
        assert code in (0, 1), err  # ended: succeeded (0), or failed or cancelled (1)
        code, out, err = self.gp(tenant, "show", workload_id, "--json")
        assert code == 0, err
        return dict(json.loads(out))


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    base = tmp_path_factory.mktemp("secrets-live")
    root = base / "shared" / "team-a"
    (root / "set").mkdir(parents=True)
    (root / "set" / "part-0").write_text("rows\n")
    (base / "outside").mkdir()
    (root / "escape").symlink_to(base / "outside")
    for path in (base / "shared", root, root / "set", base / "outside"):
        path.chmod(0o755)
    (root / "set" / "part-0").chmod(0o644)
    config = base / "pool.yaml"
    config.write_text(f"tenants:\n  team-a:\n    mounts:\n      - {{path: {root}, mode: ro}}\n")
    # its own process (not forked): the tests read the server's /proc/PID/cmdline and environ
    server = UpProcess(base / "data", ["--simulate", "1x2xH100", "--config", str(config)],
                       forked=False).start()
    try:
        tokens: dict[str, str] = {}
        admin = Pool(server, root, tokens)
        for tenant in ("team-a", "team-b"):
            assert admin.gp("admin", "tenant", "create", tenant)[0] == 0
            code, out, err = admin.gp("admin", "token", "create", "--tenant", tenant)
            assert code == 0, err
            tokens[tenant] = out.strip()
        value_file = base / "hf-token"
        value_file.write_text(VALUE)
        code, out, err = admin.gp("team-a", "secret", "create", "hf", "--from-file", f"HF_TOKEN={value_file}")
        assert (code, out) == (0, "hf (HF_TOKEN)\n"), err
        value_file.unlink()
        yield admin
    finally:
        server.stop()


READER = ("import hashlib, os; d = lambda b: hashlib.sha256(b).hexdigest(); "
          "print(d(os.environ['HF_TOKEN'].encode()), d(open('/run/secrets/hf').read().encode()), "
          "oct(os.stat('/run/secrets/hf').st_mode & 0o777), open('/mnt/set/part-0').read().strip())")


def test_the_owners_pod_gets_the_secret_and_its_mount(pool: Pool) -> None:
    code, out, err = pool.gp("team-a", "submit", "--secret", "hf", "--secret", "hf:/run/secrets/hf",
                             "--mount", f"{pool.root}:/mnt:ro", "--", pod_python(), "-c", READER)
    assert code == 0, err
    shown = pool.finished("team-a", out.strip())
    assert shown["status"] == "succeeded", json.dumps(shown)
    code, logs, _ = pool.gp("team-a", "logs", out.strip())
    assert logs.split() == [DIGEST, DIGEST, "0o400", "rows"]
    stored = shown["spec"]["secrets"]  # type: ignore[index]
    assert [(s["name"], s["env"], s["path"]) for s in stored] == [("hf", "", ""),
                                                                   ("hf", "", "/run/secrets/hf")]


def test_a_second_tenant_cannot_read_list_use_delete_or_guess_it(pool: Pool) -> None:
    code, out, _ = pool.gp("team-b", "secret", "ls", "-o", "json")
    assert code == 0 and json.loads(out) == []
    nonexistent = {}
    for name in ("hf", "no-such-secret"):  # another tenant's secret reads as one that does not exist
        code, _, err = pool.gp("team-b", "submit", "--secret", f"{name}:X", "--", "true")
        assert code == 3, err
        nonexistent[name] = err.replace(name, "NAME")
        code, _, err2 = pool.gp("team-b", "secret", "delete", name)
        assert code == 3 and "has no secret named" in err2, err2
        nonexistent[name + "-delete"] = err2.replace(name, "NAME")
    assert nonexistent["hf"] == nonexistent["no-such-secret"]
    assert nonexistent["hf-delete"] == nonexistent["no-such-secret-delete"]
    assert "Tenant 'team-b' has no secret named 'NAME'" in nonexistent["hf"]
    code, _, err = pool.gp("team-b", "secret", "create", "hf", "--from-literal", "A=b", "--tenant", "team-a")
    assert code == 3 and "cannot act for 'team-a'" in err
    code, out, _ = pool.gp("admin", "secret", "ls", "-o", "json")
    assert [(s["tenant"], s["name"], s["keys"]) for s in json.loads(out)] == [("team-a", "hf", ["HF_TOKEN"])]


@pytest.mark.parametrize(("tenant", "mount", "said"), [
    ("team-b", "{root}/set:/data:ro", "Tenant 'team-b' may not mount anything"),
    ("team-a", "/etc:/data:ro", "/etc is outside the roots tenant 'team-a' may mount from: {root} (ro)"),
    ("team-a", "{root}/../../outside:/data:ro", "without '.', '..'"),
    ("team-a", "{root}/set:/data", "mount it with :ro"),
    ("team-a", "{root}/set:/proc/x:ro", "may not be /, or cover or lie in /proc"),
])
def test_a_mount_outside_the_roots_exits_2_naming_them(pool: Pool, tenant: str, mount: str,
                                                       said: str) -> None:
    code, out, err = pool.gp(tenant, "submit", "--mount", mount.format(root=pool.root), "--", "true")
    assert (code, out) == (2, ""), err
    assert said.format(root=pool.root) in err and "Traceback" not in err


def test_a_symlink_out_of_the_root_fails_the_pod_with_the_reason(pool: Pool) -> None:
    code, out, err = pool.gp("team-a", "submit", "--mount", f"{pool.root}/escape:/data:ro", "--", "true")
    assert code == 0, err  # inside the root by its path: only the node, resolving it, finds where it leads
    shown = pool.finished("team-a", out.strip())
    assert shown["status"] == "failed"
    assert "leads outside the allowed root" in json.dumps(shown), shown


def test_the_value_is_nowhere_but_in_the_pod(pool: Pool) -> None:
    """The store, the server's log, every answer the admin can read, and the environment and command
    line of the server and its launcher helpers: none holds the value. The key file is 0600. A pod
    given the secret runs first (here, not only in the tests before: chosen alone, this test would
    look at a server that never handed the value to a launch)."""
    code, out, err = pool.gp("team-a", "submit", "--secret", "hf", "--", "true")
    assert code == 0, err
    assert pool.finished("team-a", out.strip())["status"] == "succeeded"
    data = pool.server.data_dir
    key = data / "secrets.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    for path in data.glob("gpupool.sqlite*"):
        assert VALUE.encode() not in path.read_bytes(), path
    assert VALUE not in pool.server.log_text()
    with pool.server.client() as api:
        answers = [api.get(p).text for p in ("/secrets", "/workloads", "/audit", "/config")]
        for workload in api.get("/workloads").json()["items"]:
            answers += [api.get(f"/workloads/{workload['id']}").text,
                        api.get(f"/workloads/{workload['id']}/events").text]
    assert all(VALUE not in text for text in answers)
    assert pool.server.proc is not None
    pids = {pool.server.proc.pid}
    while True:  # the server and its descendants of its own user (the launcher helpers), not pods
        more = {int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) in pids
                and _uid(int(p)) == os.geteuid()} - pids
        if not more:
            break
        pids |= more
    assert len(pids) >= 3, pids  # the server, the root launcher helper and an account's helper
    for pid in pids:
        for part in ("environ", "cmdline"):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # ended meanwhile
                assert VALUE.encode() not in Path(f"/proc/{pid}/{part}").read_bytes(), (pid, part)


def test_a_secret_deleted_before_the_launch_fails_the_pod_with_a_sentence(pool: Pool) -> None:
    """Held off the nodes (cordoned) until its secret is gone, the pod is refused at its launch."""
    assert pool.gp("team-a", "secret", "create", "tmp", "--from-literal", "K=v")[0] == 0
    code, out, _ = pool.gp("admin", "node", "ls", "-o", "json")
    nodes = [n["name"] for n in json.loads(out)]
    for node in nodes:
        assert pool.gp("admin", "node", "cordon", node)[0] == 0
    try:
        code, out, err = pool.gp("team-a", "submit", "--secret", "tmp:K", "--", "true")
        assert code == 0, err
        assert pool.gp("team-a", "secret", "delete", "tmp") == (0, "deleted tmp\n", "")
    finally:
        for node in nodes:
            assert pool.gp("admin", "node", "uncordon", node)[0] == 0
    shown = pool.finished("team-a", out.strip())
    assert shown["status"] == "failed" and "secret 'tmp' no longer exists" in str(shown["message"]), shown


PROBE = """
import hashlib, os, pwd, sys
want, env, files = sys.argv[1], 0, 0
d = lambda b: hashlib.sha256(b).hexdigest()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        items = open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")
    except OSError:
        items = []
    env += sum(d(item.partition(b"=")[2]) == want for item in items)
    for where, _, names in os.walk(f"/proc/{pid}/root/run/secrets"):
        for name in names:
            try:
                files += d(open(os.path.join(where, name), "rb").read()) == want
            except OSError:
                pass
print(pwd.getpwuid(os.getuid()).pw_name, env, files)
"""
"""Counts the variables and files under /run/secrets, of every process it may read, whose value's
digest is DIGEST; prints its account and both counts (never a value)."""


def test_work_the_admin_or_a_hub_starts_for_the_tenant_cannot_read_its_secrets(pool: Pool) -> None:
    """The admin and a federation hub act for a tenant but never read its secrets: their work runs as
    the tenant's on-behalf account, so it cannot read the environment or the /run/secrets of the
    tenant's own pod on the same node, which the tenant's own pod with the same probe can."""
    code, out, err = pool.gp("team-a", "submit", "--gpus", "0", "--secret", "hf", "--secret",
                             "hf:/run/secrets/hf", "--", "sleep", "300")
    assert code == 0, err
    holder = out.strip()
    try:
        deadline = time.monotonic() + 60
        while json.loads(pool.gp("team-a", "show", holder, "--json")[1])["status"] != "running":
            assert time.monotonic() < deadline, "the pod holding the secret never ran"
            time.sleep(0.2)
        probe = ["--gpus", "0", "--", pod_python(), "-c", PROBE, DIGEST]
        ran = {"team-a": pool.gp("team-a", "submit", *probe),
               "admin": pool.gp("admin", "submit", "--tenant", "team-a", *probe)}
        code, out, err = pool.gp("admin", "token", "create", "--admin", "--scope", "federation")
        assert code == 0, err
        with pool.server.client() as api:
            hub = api.post("/workloads", headers={"Authorization": f"Bearer {out.strip()}",
                                                  "X-Gpupool-On-Behalf-Of": "team-a"},
                           json={"command": probe[3:], "resources": {"gpus": 0}})
        assert hub.status_code == 201, hub.text
        ran["hub"] = (0, hub.json()["id"], "")
        seen = {}
        for who, (code, out, err) in ran.items():
            assert code == 0, err
            assert pool.finished("team-a", out.strip())["status"] == "succeeded", who
            seen[who] = pool.gp("team-a", "logs", out.strip())[1].split()
    finally:
        pool.gp("team-a", "cancel", holder)
    own = seen["team-a"][0]
    assert own.startswith("gpupool-") and own.endswith("-team-a"), own
    found = [int(n) for n in seen["team-a"][1:]]  # the pod's shim and its command: one or both
    assert min(found) >= 1, f"the probe finds the secret as the tenant's own account: {seen}"
    assert seen["admin"] == seen["hub"] == [own + "_ob", "0", "0"]


def _uid(pid: int) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


def _parent(pid: int) -> int:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(raw[raw.rfind(")") + 2:].split()[1])


