"""Tenant fields through the API: Unix account, max priority (the admin's to give) and max pending."""

from __future__ import annotations

import pwd

import pytest

from conftest import Server
from gpupool.agent.identity import Identities, PodIdentity, account_name, ensure_account, is_pool_account
from gpupool.api.workloads import WorkloadSpec
from gpupool.errors import PriorityNotAllowed
from gpupool.server.auth import Principal
from gpupool.server.services import tenants as tenants_service
from gpupool.server.services import workloads as workloads_service

API = "/api/v1"


def _unprivileged_account() -> str:
    for entry in pwd.getpwall():
        if entry.pw_uid != 0 and len(entry.pw_name) <= 32 and not is_pool_account(
                PodIdentity(entry.pw_name, entry.pw_uid, entry.pw_gid)):
            return entry.pw_name
    pytest.skip("this machine has no unprivileged Unix account")


def _create(server: Server, **body: object) -> dict[str, object]:
    return server.created("/tenants", body)


def _tenant_token(server: Server, tenant: str) -> str:
    return str(server.created("/tokens", {"tenant": tenant})["token"])


def _patch(server: Server, name: str, token: str | None = None, **body: object) -> dict[str, object]:
    answer = server.client.patch(f"{API}/tenants/{name}", json=body, headers=server.headers(token))
    return {"status": answer.status_code, **answer.json()}


def test_create_with_limits_and_an_account_shows_them(server: Server) -> None:
    user = _unprivileged_account()
    created = _create(server, name="team-a", unix_user=user, max_priority=5, max_pending=7)
    assert (created["max_priority"], created["max_pending"], created["unix_user"]) == (5, 7, user)
    plain = _create(server, name="team-b")
    assert (plain["max_priority"], plain["max_pending"], plain["unix_user"]) == (0, 10_000, None)
    listed = {t["name"]: t for t in server.client.get(f"{API}/tenants", headers=server.headers()).json()}
    assert listed["team-a"]["unix_user"] == user and listed["default"]["max_pending"] == 10_000


@pytest.mark.parametrize(("account", "words"), [
    ("no-such-account-x", "There is no Unix account"),
    ("root", "uid 0"),
])
def test_a_missing_or_root_account_is_refused(server: Server, account: str, words: str) -> None:
    answer = server.client.post(f"{API}/tenants", json={"name": "team-a", "unix_user": account},
                                headers=server.headers())
    assert answer.status_code == 422 and answer.json()["code"] == "invalid_input"
    assert words in answer.json()["message"]
    assert server.client.get(f"{API}/tenants", headers=server.headers()).json()[-1]["name"] != "team-a"


def test_two_tenants_cannot_share_an_account(server: Server) -> None:
    user = _unprivileged_account()
    _create(server, name="team-a", unix_user=user)
    answer = server.client.post(f"{API}/tenants", json={"name": "team-b", "unix_user": user},
                                headers=server.headers())
    assert answer.status_code == 422 and "team-a" in answer.json()["message"]


needs_root = pytest.mark.skipif(not tenants_service.server_is_root(), reason="creates Unix accounts")


@needs_root
def test_a_tenant_cannot_map_to_another_tenants_pool_account(server: Server) -> None:
    # The attack: c mapped to gpupool-b would run as b and read b's files and checkpoints.
    _create(server, name="b")
    victim = ensure_account(account_name("b"))  # made at b's first pod; here, made now
    answer = server.client.post(f"{API}/tenants", json={"name": "c", "unix_user": victim.user},
                                headers=server.headers())
    assert answer.status_code == 422, answer.text
    message = answer.json()["message"]
    assert "'gpupool-b' is a pool account (tenant b's pods run as it)" in message
    assert "map 'c' to an account of its own" in message
    _create(server, name="c")
    assert _patch(server, "c", unix_user=victim.user)["status"] == 422  # nor by a later change
    # a pool account of no tenant yet (b's before it exists, or a name to come) is refused too
    spare = ensure_account(account_name("not-yet-a-tenant"))
    assert _patch(server, "c", unix_user=spare.user)["status"] == 422
    # its own pool account is its own
    assert _patch(server, "b", unix_user=victim.user)["status"] == 200


@needs_root
def test_a_new_tenant_whose_pool_account_another_is_mapped_to_is_refused(server: Server) -> None:
    from gpupool.server.orm import TenantRow

    _create(server, name="c")
    account = ensure_account(account_name("d"))
    with server.rt.store.write() as session:  # a mapping stored before the server refused it
        row = session.get(TenantRow, "c")
        assert row is not None
        row.unix_user = account.user
    answer = server.client.post(f"{API}/tenants", json={"name": "d"}, headers=server.headers())
    assert answer.status_code == 422, answer.text
    assert "which tenant 'c' is mapped to" in answer.json()["message"]
    with pytest.raises(Exception, match="the pool's account of another tenant"):
        Identities(switch_users=True).resolve("c", account.user)  # and the agent will not start c's pods


def test_set_changes_only_what_is_given(server: Server) -> None:
    user = _unprivileged_account()
    _create(server, name="team-a", unix_user=user, max_pending=9)
    changed = _patch(server, "team-a", max_priority=10)
    assert (changed["status"], changed["max_priority"], changed["max_pending"], changed["unix_user"]) == (
        200, 10, 9, user)
    cleared = _patch(server, "team-a", unix_user=None)
    assert cleared["unix_user"] is None and cleared["max_priority"] == 10
    assert _patch(server, "nobody-here", max_priority=1)["status"] == 404
    assert _patch(server, "team-a", token=_tenant_token(server, "team-a"), max_priority=99)["status"] == 403
    assert _patch(server, "team-a", max_priority=5000)["status"] == 422


def test_a_second_tenant_warns_when_the_server_is_not_root(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tenants_service, "server_is_root", lambda: False)
    warned = _create(server, name="team-a")
    assert "not isolated from each other" in str(warned["warning"])
    monkeypatch.setattr(tenants_service, "server_is_root", lambda: True)
    assert _create(server, name="team-b")["warning"] is None


def _submit(server: Server, token: str, priority: int, **extra: object) -> tuple[int, dict[str, object]]:
    answer = server.client.post(f"{API}/workloads", json={"command": ["true"], "priority": priority, **extra},
                                headers=server.headers(token))
    return answer.status_code, answer.json()


def test_a_tenant_may_not_submit_above_its_max_priority(server: Server) -> None:
    _create(server, name="team-a")
    token = _tenant_token(server, "team-a")
    assert _submit(server, token, 0)[0] == 201
    status, body = _submit(server, token, 1)
    assert status == 403 and body["code"] == "priority_not_allowed"
    assert body["message"] == ("Tenant team-a may submit at priority <= 0; ask the admin "
                               "(gpupool tenant set team-a --max-priority N).")
    assert _patch(server, "team-a", max_priority=50)["status"] == 200
    assert _submit(server, token, 50)[0] == 201  # this process sees the new limit at once
    assert _submit(server, token, 51)[0] == 403
    # The admin is not limited, also when it submits for the tenant.
    assert _submit(server, server.admin_token, 1000, tenant="team-a")[0] == 201


def test_the_priority_check_is_in_prepare_which_both_paths_call(server: Server) -> None:
    who = Principal("tok-x", "team-a", max_priority=3)
    spec = WorkloadSpec.model_validate({"command": ["true"], "priority": 4})
    with pytest.raises(PriorityNotAllowed, match="<= 3"):
        workloads_service.prepare(server.rt, who, spec)


def test_max_pending_refuses_beyond_the_limit_until_room_appears(server: Server) -> None:
    assert server.client.post(f"{API}/nodes/n0/cordon", headers=server.headers()).status_code == 200
    _create(server, name="team-a", max_pending=3)
    token = _tenant_token(server, "team-a")
    ids = [_submit(server, token, 0)[1]["id"] for _ in range(3)]
    status, body = _submit(server, token, 0)
    assert status == 429 and body["code"] == "too_many_pending"
    assert "already has 3 pending workloads" in str(body["message"])
    assert _submit(server, server.admin_token, 0)[0] == 201  # other tenants are not affected
    server.client.post(f"{API}/workloads/{ids[0]}/cancel", headers=server.headers(token))
    assert _submit(server, token, 0)[0] == 201
    assert _patch(server, "team-a", max_pending=10)["status"] == 200
    assert _submit(server, token, 0)[0] == 201


def test_the_account_of_a_tenant_with_running_pods_does_not_change(server: Server) -> None:
    """Its pods run as the account it is mapped to: the admin cleared the mapping while one ran,
    mapped a new tenant to that account, and the new tenant's work read the running pod's
    environment as the same account. The mapping changes once the tenant's pods have ended."""
    account = _unprivileged_account()
    _create(server, name="mapped", unix_user=account)
    token = _tenant_token(server, "mapped")
    made = server.client.post(f"{API}/workloads", headers=server.headers(token),
                              json={"command": ["sleep", "100"], "resources": {"gpus": 1}})
    wid = made.json()["id"]
    server.wait_for(lambda: server.status(wid) == "running")
    for change in ({"unix_user": None}, {"unix_user": "nobody"}):
        refused = _patch(server, "mapped", **change)
        assert refused["status"] == 409, refused
        assert "has 1 pod(s) not ended yet, running as the account" in str(refused["message"]), refused
    assert _patch(server, "mapped", max_pending=5)["status"] == 200  # the rest may change
    assert server.client.post(f"{API}/workloads/{wid}/cancel", headers=server.headers()).status_code == 200
    [pod] = [p for p, launch in server.provider.launched.items() if launch.workload_id == wid]
    server.provider.finish(pod)
    server.wait_for(lambda: server.status(wid) == "cancelled")
    server.wait_for(lambda: _patch(server, "mapped", unix_user=None)["status"] == 200)
