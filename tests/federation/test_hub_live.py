"""A federation on loopback: three member pools and a hub, each its own process (one set for the
module). Tenants use the hub as a pool; a member killed under load loses nothing the hub acknowledged,
its work runs again elsewhere, and when it comes back its stale copies are cancelled so each workload
runs in exactly one member."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpupool.client import Client
from gpupool.federation.hub import FEDERATION_ID_ENV
from gpupool.federation.loopback import Federation, copies, start_federation, until
from ports import free_port
from server.upproc import spawn_gpupool

pytestmark = pytest.mark.slow
LONG = {"GPUPOOL_FAKE_DURATION_S": "3600"}


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    federation = start_federation(tmp_path_factory.mktemp("fed"), ghost=True, free_port=free_port,
                                  spawn=spawn_gpupool)
    yield federation
    federation.stop()


def _hub_row(fed: Federation, workload_id: str) -> dict[str, object]:
    with fed.hub_api() as api:
        return dict(api.get(f"/workloads/{workload_id}").json())


def _placed(fed: Federation, workload_id: str) -> str | None:
    with fed.hub_api() as api:
        record = api.get(f"/federation/workloads/{workload_id}").json()
    return record["member"] if record["state"] == "placed" else None


def test_the_hub_starts_with_a_member_down_and_says_so(fed: Federation) -> None:
    assert "Member ghost" in fed.hub_output and "marked down" in fed.hub_output
    with fed.hub_api() as api:
        states = {m["name"]: m["state"] for m in api.get("/federation/members").json()}
    assert states == {"east": "up", "west": "up", "north": "up", "ghost": "down"}
    with fed.hub.admin() as admin:  # type: ignore[union-attr]  # the addresses are the admin's only
        assert all(m["url"].startswith("http://127.0.0.1:") for m in admin.get("/federation/members").json())
    with fed.hub_api() as api:
        assert {m["url"] for m in api.get("/federation/members").json()} == {""}
        pool = api.get("/pool").json()  # the dashboard's overview and `gpupool top` at the hub
    assert (pool["nodes"], pool["capacity_gpus"]) == (3, 12.0)  # three members of 1x4, the ghost down
    assert {t["tenant"] for t in pool["by_tenant"]} <= {"alice"}


def test_a_tenant_uses_the_hub_as_a_pool(fed: Federation) -> None:
    assert fed.hub is not None
    with Client(fed.hub.url, fed.alice_token) as pool:
        workload_id = pool.submit(command=["train"], gpus=1, env=LONG)
        until(lambda: pool.workload(workload_id).status == "running", 30, "placed and running")
        shown = pool.workload(workload_id)
        assert shown.id == workload_id and shown.tenant == "alice"
        assert FEDERATION_ID_ENV not in shown.spec.env  # the hub's bookkeeping is not the tenant's
        assert workload_id in [w.id for w in pool.workloads().items]
        assert "federation_placed" in [e.reason for e in pool.events(workload_id)]
        held = copies(fed.member("east"))[workload_id]  # alice's home, under policy home
        assert len(held) == 1 and held[0]["tenant"] == "alice"
        assert pool.cancel(workload_id).status == "cancelled"
    until(lambda: workload_id not in copies(fed.member("east")), 10, "cancelled on the member too")


@pytest.fixture
def alices_work(fed: Federation) -> None:
    """Work of alice's placed through the hub and run on a member: what the tests before leave, or,
    for a test chosen alone, a workload of a second's run made here."""
    assert fed.hub is not None
    with Client(fed.hub.url, fed.alice_token) as pool:
        if pool.workloads().items:
            return
        workload_id = pool.submit(command=["train"], gpus=1, env={"GPUPOOL_FAKE_DURATION_S": "1"})
        until(lambda: pool.workload(workload_id).status == "succeeded", 60, "alice's workload run")


def test_usage_at_the_hub_adds_the_members_metering(fed: Federation, alices_work: None) -> None:
    with fed.hub_api() as api:
        merged = api.get("/usage", params={"by": "tenant"}).json()
        split = api.get("/federation/usage", params={"by": "tenant"}).json()
    direct = {}
    for member in fed.members:
        with member.admin() as admin:
            answer = admin.get("/usage", params={"by": "tenant", "tenant": "alice"})
            direct[member.name] = answer.json()["total"]
    assert split["missing"] == ["ghost"]
    assert {name: row["pods"] for name, row in split["members"].items()} == \
        {name: row["pods"] for name, row in direct.items()}
    assert merged["total"]["pods"] == sum(row["pods"] for row in direct.values()) >= 1
    assert set(split["regions"]) == {"east", "west", "north"}


def test_the_cli_at_the_hub(fed: Federation, alices_work: None) -> None:
    import json

    from typer.testing import CliRunner

    from gpupool.cli.main import app

    assert fed.hub is not None
    env = {"GPUPOOL_URL": fed.hub.url, "GPUPOOL_TOKEN": fed.alice_token}
    runner = CliRunner()
    members = runner.invoke(app, ["fed", "ls", "-o", "json"], env=env)
    assert members.exit_code == 0, members.output
    assert {m["name"]: m["state"] for m in json.loads(members.output)}["ghost"] == "down"
    table = runner.invoke(app, ["fed", "ls"], env=env, terminal_width=200)
    assert "ghost" in table.output and "down" in table.output
    listed = runner.invoke(app, ["ls", "-o", "json"], env=env)
    assert listed.exit_code == 0, listed.output
    ids = [w["id"] for w in json.loads(listed.output)]
    assert ids and all(i.startswith("f-") for i in ids)
    shown = runner.invoke(app, ["show", ids[0][:6], "-o", "json"], env=env)  # a unique prefix, as at a pool
    if len([i for i in ids if i.startswith(ids[0][:6])]) == 1:
        assert shown.exit_code == 0 and json.loads(shown.output)["id"] == ids[0], shown.output
    bill = runner.invoke(app, ["invoice", "--tenant", "alice", "--month",
                               time.strftime("%Y-%m", time.gmtime()), "-o", "json"], env=env)
    assert bill.exit_code == 0, bill.output
    missing = runner.invoke(app, ["show", "f-000000000000"], env=env)
    assert missing.exit_code == 3 and "No workload" in missing.output


def test_another_tenant_sees_nothing_of_it(fed: Federation) -> None:
    assert fed.hub is not None
    with fed.hub.admin() as admin:
        assert admin.post("/tenants", json={"name": "bob"}).status_code == 201
        bob = admin.post("/tokens", json={"tenant": "bob", "name": "bob"}).json()["token"]
    with fed.hub_api() as alice:
        workload_id = alice.post("/workloads", json={"command": ["x"], "env": LONG}).json()["id"]
    with fed.hub_api(bob) as api:
        assert api.get(f"/workloads/{workload_id}").status_code == 404
        assert api.get(f"/workloads/{workload_id}/events").status_code == 404
        assert api.get(f"/workloads/{workload_id}/logs").status_code == 404
        assert api.post(f"/workloads/{workload_id}/cancel").status_code == 404
        assert api.get("/workloads").json()["total"] == 0
        spoof = api.post("/workloads", json={"command": ["x"], "tenant": "alice"})
        assert spoof.status_code == 403
    assert _hub_row(fed, workload_id)["status"] != "cancelled"
    with fed.hub_api() as alice:
        alice.post(f"/workloads/{workload_id}/cancel")


def _everything_on_the_members(fed: Federation) -> dict[str, set[str]]:
    out = {}
    for member in fed.members:
        with member.admin() as api:
            items = api.get("/workloads", params={"limit": 1000}).json()["items"]
        out[member.name] = {w["id"] for w in items}
    return out


def test_the_hubs_admin_opens_no_remote_function_session_for_a_tenant(fed: Federation) -> None:
    """Behind the hub the member sees the tenant, not the admin, so the hub refuses it itself: the
    results are pickles the admin's SDK would load, posted by code running as alice's account."""
    assert fed.hub is not None
    before = _everything_on_the_members(fed)
    with fed.hub.admin() as admin:
        opened = admin.post("/calls/sessions", json={"tenant": "alice", "python": "3.11",
                                                     "resources": {"gpus": 1}})
    assert opened.status_code == 403, opened.text
    assert "default tenant only" in opened.json()["message"] and "alice's tokens" in opened.json()["message"]
    assert _everything_on_the_members(fed) == before  # nothing forwarded: no session's workload


def test_the_hub_restarts_on_its_record(fed: Federation) -> None:
    assert fed.hub is not None
    with fed.hub_api() as api:
        workload_id = api.post("/workloads", json={"command": ["x"], "env": LONG}).json()["id"]
    until(lambda: _hub_row(fed, workload_id)["status"] == "running", 30, "running")
    fed.hub.stop()
    fed.hub.start()
    fed.hub.wait_up()
    assert _placed(fed, workload_id) == "east" and _hub_row(fed, workload_id)["status"] == "running"
    with fed.hub_api() as api:
        assert api.post(f"/workloads/{workload_id}/cancel").json()["status"] == "cancelled"
    until(lambda: workload_id not in copies(fed.member("east")), 10, "cancelled on east after the restart")


def test_a_member_killed_under_load_loses_nothing_and_nothing_runs_twice(fed: Federation) -> None:
    east, others = fed.member("east"), [fed.member("west"), fed.member("north")]
    body = {"command": ["x"], "resources": {"gpus": 1}, "env": LONG}
    with fed.hub_api() as api:
        ids = [api.post("/workloads", json=body).json()["id"] for _ in range(8)]
    # all acknowledged; under policy home all go to east: 4 run there, 4 wait there
    until(lambda: len([i for i in ids if i in copies(east)]) == 8, 30, "all placed on east")
    east.kill()
    until(lambda: all(_placed(fed, i) in ("west", "north") for i in ids), 60, "all placed elsewhere")
    until(lambda: all(_hub_row(fed, i)["status"] == "running" for i in ids), 30, "all running elsewhere")
    where = {i: [m.name for m in others if i in copies(m)] for i in ids}
    assert all(len(names) == 1 for names in where.values()), where  # one copy each, none on two members
    restarted_s = time.time()
    east.start()
    east.wait_up()
    twice: list[str] = []

    def swept() -> bool:  # sampled until east holds none of them: never running in two members
        held = [copies(m) for m in fed.members]
        twice.extend(i for i in ids if sum(h.get(i, [{}])[0].get("status") == "running" for h in held) > 1)
        return not any(i in held[0] for i in ids)

    until(swept, 60, "east's stale copies cancelled")
    assert twice == []
    with east.admin() as admin:  # and east started none of them again after its restart
        for fed_id, items in copies(east, active_only=False).items():
            if fed_id in ids:
                for item in items:
                    events = admin.get(f"/workloads/{item['id']}/events").json()
                    started = [e for e in events if e["at_s"] >= restarted_s and e["to_status"] == "running"]
                    assert started == [], (fed_id, started)
    for workload_id in ids:
        holders = [m.name for m in fed.members if workload_id in copies(m)]
        assert holders == where[workload_id], (workload_id, holders)
        reasons = [e["reason"] for e in httpx.get(
            f"{fed.hub.url}/api/v1/workloads/{workload_id}/events",  # type: ignore[union-attr]
            headers={"Authorization": f"Bearer {fed.alice_token}"}).json()]
        assert "federation_moved" in reasons and "federation_stale_cancelled" in reasons


def test_a_bad_federation_file_is_refused_with_a_sentence_each(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpupool.cli.main import app

    (tmp_path / "fed.yaml").write_text(
        "policy: cheapset\nmembers:\n  - name: a\n    url: ftp://x\n    token_file: missing\n    region: r\n"
        "    prices: {gpu_hour: -1}\ntenants:\n  t: {home: b, polcy: home}\n")
    result = CliRunner().invoke(app, ["up", "--federation", str(tmp_path / "fed.yaml"),
                                      "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    for sentence in ("there is no policy 'cheapset'", "Did you mean 'cheapest'?", "url must be http(s)://",
                     "token_file", "gpu_hour must be a non-negative number", "tenants.t.home is 'b'",
                     "unknown key 'polcy'"):
        assert sentence in text, (sentence, text)
    assert "Traceback" not in result.output


def test_hold_update_and_release_through_the_hub_reach_the_member_holding_it(fed: Federation) -> None:
    east = fed.member("east")
    full = {"command": ["x"], "resources": {"gpus": 4}, "env": LONG}
    with fed.hub_api() as api:
        blocker = api.post("/workloads", json=full).json()["id"]
        until(lambda: _hub_row(fed, blocker)["status"] == "running", 30, "the blocker running on east")
        waiting = api.post("/workloads", json=full).json()["id"]
        until(lambda: waiting in copies(east), 30, "the second placed on east, waiting there")
        held = api.post(f"/workloads/{waiting}/hold")
        assert held.status_code == 200, held.text
        assert held.json()["id"] == waiting and held.json()["held"] == "user"
        assert copies(east)[waiting][0]["held"] == "user"  # the member's copy is held, under its own id
        changed = api.patch(f"/workloads/{waiting}", json={"priority": -5})
        assert changed.status_code == 200 and changed.json()["priority"] == -5, changed.text
        assert api.post(f"/workloads/{blocker}/cancel").json()["status"] == "cancelled"
        # east is free now; a later workload starting there through the hub means east scheduled with
        # room and the hub's watch read the held copy since: neither started it nor released it
        small = {"command": ["x"], "resources": {"gpus": 1}, "env": LONG}
        later = api.post("/workloads", json=small).json()["id"]
        until(lambda: _hub_row(fed, later)["status"] == "running", 30, "a later workload running on east")
        assert _hub_row(fed, waiting)["status"] == "pending" and _placed(fed, waiting) == "east"
        assert copies(east)[waiting][0]["held"] == "user"
        assert api.post(f"/workloads/{later}/cancel").json()["status"] == "cancelled"  # room for all 4
        with Client(fed.hub.url, fed.alice_token) as sdk:  # what `gpupool release` calls
            assert sdk.release(waiting).held == ""
        until(lambda: _hub_row(fed, waiting)["status"] == "running", 30, "released: it starts on east")
        assert _placed(fed, waiting) == "east"
        reasons = [e["reason"] for e in api.get(f"/workloads/{waiting}/events").json()]
        assert {"federation_hold", "federation_update", "federation_release"} <= set(reasons), reasons
        api.post(f"/workloads/{waiting}/cancel")


def test_job_control_at_the_hub_is_scoped_to_the_tenant_and_to_the_admins_hold(fed: Federation) -> None:
    assert fed.hub is not None
    with fed.hub.admin() as admin:
        if "mallory" not in {t["name"] for t in admin.get("/tenants").json()}:
            assert admin.post("/tenants", json={"name": "mallory"}).status_code == 201
        mallory = admin.post("/tokens", json={"tenant": "mallory", "name": "mallory"}).json()["token"]
        with fed.hub_api() as alice:  # more than any member has: it stays at the hub, on no member
            workload_id = alice.post("/workloads", json={"command": ["x"], "resources": {"gpus": 64},
                                                         "env": LONG}).json()["id"]
            with fed.hub_api(mallory) as api:
                for method, leaf in (("POST", "/hold"), ("POST", "/release"), ("POST", "/requeue"),
                                     ("PATCH", "")):
                    answer = api.request(method, f"/workloads/{workload_id}{leaf}",
                                         json={"priority": 1} if method == "PATCH" else None)
                    assert answer.status_code == 404, (method, leaf, answer.text)
            assert admin.post(f"/workloads/{workload_id}/hold").json()["held"] == "admin"
            refused = alice.post(f"/workloads/{workload_id}/release")
            assert refused.status_code == 409 and "only the admin releases it" in refused.json()["message"]
            assert alice.get(f"/workloads/{workload_id}").json()["held"] == "admin"
            assert admin.post(f"/workloads/{workload_id}/release").json()["held"] == ""
            alice.post(f"/workloads/{workload_id}/cancel")


def test_a_hold_the_member_refuses_comes_back_as_it_said_it_and_leaves_no_hold_at_the_hub(
        fed: Federation) -> None:
    with fed.hub_api() as api:
        workload_id = api.post("/workloads", json={"command": ["x"], "env": LONG}).json()["id"]
        until(lambda: _hub_row(fed, workload_id)["status"] == "running", 30, "running on east")
        refused = api.post(f"/workloads/{workload_id}/hold")
        assert refused.status_code == 409, refused.text  # the member's sentence: it runs already
        assert "Traceback" not in refused.text and refused.json()["message"]
        # the hub's record is not left held: a later move would offer it again
        assert api.get(f"/federation/workloads/{workload_id}").json()["held"] == ""
        api.post(f"/workloads/{workload_id}/cancel")
