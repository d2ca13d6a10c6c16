"""Recovery at start-up: a pod the store recorded `launching` that never reached the provider is
placed again; one that ran and vanished fails; a gang of which one pod started is never restarted."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fakes import ManualProvider
from sqlalchemy import update

from conftest import Server
from factories import node
from gpupool.pods import PodPhase, PodStatus
from gpupool.server.orm import PodRow


def _submit(server: Server, replicas: int = 1) -> str:
    answer = server.client.post("/api/v1/workloads", headers=server.headers(),
                                json={"command": ["sleep", "1"], "replicas": replicas,
                                      "resources": {"gpus": 1}})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _events(server: Server, wid: str) -> list[str]:
    answer = server.client.get(f"/api/v1/workloads/{wid}/events", headers=server.headers())
    return [e["reason"] for e in answer.json()]


def test_recovery_requeues_only_what_never_started(server_factory: Callable[..., Server]) -> None:
    first = server_factory()
    never, adopted, vanished, gang = _submit(first), _submit(first), _submit(first), _submit(first, 2)
    first.wait_for(lambda: all(first.status(w) == "running" for w in (never, adopted, vanished, gang)))
    url = first.rt.settings.resolved_database_url
    pods = dict(first.provider.status)
    with first.rt.store.write() as session:  # as if the server died between recording and launching
        session.execute(update(PodRow).where(PodRow.workload_id == never).values(status="launching"))
        session.execute(update(PodRow).where(PodRow.workload_id == gang, PodRow.rank == 1)
                        .values(status="launching"))
    first.client.__exit__(None, None, None)

    survivor = ManualProvider([node("n0", devices=8, model="H100")])
    for pod_id in pods:  # the provider still knows what it started, not the rest
        if pod_id.startswith((adopted, f"{gang}-a1-r0")):
            survivor.status[pod_id] = PodStatus(pod_id, PodPhase.RUNNING)
    second = server_factory(url=url, provider=survivor)
    second.admin_token = first.admin_token
    second.wait_for(lambda: second.status(never) == "running")
    assert _events(second, never)[-3:] == ["requeued_on_restart", "admitted", "launched"]
    assert survivor.launch_count == {f"{never}-a2-r0": 1}  # placed again, as a new attempt; nothing else
    assert second.status(adopted) == "running" and _events(second, adopted)[-1] == "adopted"
    assert second.status(vanished) == "failed" and _events(second, vanished)[-1] == "lost_on_restart"
    assert second.status(gang) == "failed"  # rank 0 had started: the gang is not started twice
    assert f"{gang}-a1-r0" in survivor.stopped


def test_a_failed_pod_is_reported_once_not_twice(server: Server) -> None:
    wid = _submit(server)
    server.wait_for(lambda: server.status(wid) == "running")
    (pod_id,) = list(server.provider.status)
    with server.provider._lock:  # a provider whose message repeats the exit code (the local one does)
        server.provider.status[pod_id] = PodStatus(pod_id, PodPhase.FAILED, 3, "exited with code 3")
    server.wait_for(lambda: server.status(wid) == "failed")
    message = server.client.get(f"/api/v1/workloads/{wid}", headers=server.headers()).json()["message"]
    assert message == "Pod r0 exited with code 3."


def test_a_pod_its_node_says_never_started_is_placed_again(server_factory: Callable[..., Server]) -> None:
    # The server died after the node saved the pod's process id and before it let the command run
    # (agent/shim.py NEVER_STARTED): the next server neither adopts it nor fails its workload.
    first = server_factory()
    at_restart, later = _submit(first), _submit(first)
    first.wait_for(lambda: all(first.status(w) == "running" for w in (at_restart, later)))
    url = first.rt.settings.resolved_database_url
    pods = dict(first.provider.status)
    first.client.__exit__(None, None, None)

    survivor = ManualProvider([node("n0", devices=8, model="H100")])
    for pod_id in pods:
        if pod_id.startswith(at_restart):  # known to the node, and ended before its command ran
            survivor.status[pod_id] = PodStatus(pod_id, PodPhase.LOST, never_started=True)
        else:  # still starting when the new server took over: it ends so once adopted
            survivor.status[pod_id] = PodStatus(pod_id, PodPhase.RUNNING)
    second = server_factory(url=url, provider=survivor)
    second.admin_token = first.admin_token
    second.wait_for(lambda: second.status(at_restart) == "running")
    assert _events(second, at_restart)[-3:] == ["requeued_on_restart", "admitted", "launched"]
    assert survivor.launch_count == {f"{at_restart}-a2-r0": 1}

    [adopted] = [p for p in pods if p.startswith(later)]
    assert second.status(later) == "running" and _events(second, later)[-1] == "adopted"
    survivor.status[adopted] = PodStatus(adopted, PodPhase.LOST, never_started=True)

    def placed_again() -> bool:  # running again, in its second attempt: not the running it was before
        shown = second.client.get(f"/api/v1/workloads/{later}", headers=second.headers()).json()
        return bool(shown["status"] == "running" and shown["attempt"] == 2)

    # (its new pod reaching the provider is not enough: the launch is recorded, with its event and
    # the move to running, once the provider has answered, and `running` read before that was the
    # status it had before the requeue)
    second.wait_for(placed_again)
    assert f"{later}-a2-r0" in survivor.launched
    assert _events(second, later)[-3:] == ["requeued_on_restart", "admitted", "launched"]
    workload = second.client.get(f"/api/v1/workloads/{later}", headers=second.headers()).json()
    assert workload["retries"] == 0  # not a failure: no retry used up


class _Reopened(ManualProvider):
    """A provider opened afresh over nodes that ran pods before: it lists their finished pods again
    until told to forget them; records at which poll each forget came."""

    def __init__(self) -> None:
        super().__init__([node("n0", devices=8, model="H100")])
        self.polls = 0
        self.forgotten: dict[str, int] = {}

    def poll(self) -> list[PodStatus]:
        self.polls += 1
        return super().poll()

    def forget_pods(self, pod_ids: Sequence[str]) -> None:
        for pod_id in pod_ids:
            if self.status.get(pod_id) is not None and self.status[pod_id].phase.is_final:
                self.forgotten.setdefault(pod_id, self.polls)
                del self.status[pod_id]


def test_recovery_acknowledges_at_once_the_finished_pods_the_store_has_settled(
        server_factory: Callable[..., Server]) -> None:
    # A new leader's provider lists its nodes' history again: what the store holds final is not walked
    # again by the first sync (at a takeover it delayed the first decision by the pool's history).
    first = server_factory()
    done, running = _submit(first), _submit(first)
    first.wait_for(lambda: all(first.status(w) == "running" for w in (done, running)))
    [done_pod] = [p for p in first.provider.status if p.startswith(done)]
    [running_pod] = [p for p in first.provider.status if p.startswith(running)]
    first.provider.finish(done_pod)
    first.wait_for(lambda: first.status(done) == "succeeded")
    url = first.rt.settings.resolved_database_url
    first.client.__exit__(None, None, None)

    reopened = _Reopened()
    reopened.status[done_pod] = PodStatus(done_pod, PodPhase.SUCCEEDED, 0)
    reopened.status[running_pod] = PodStatus(running_pod, PodPhase.RUNNING)
    unknown = "w-unknown-a1-r0"  # a pod the store never had (its row gone): nothing to apply either
    reopened.status[unknown] = PodStatus(unknown, PodPhase.FAILED, 1)
    second = server_factory(url=url, provider=reopened)
    second.admin_token = first.admin_token
    second.wait_for(lambda: second.status(running) == "running" and reopened.polls > 1)
    assert reopened.forgotten == {done_pod: 1, unknown: 1}  # right after recovery's own poll
    reopened.finish(running_pod)
    second.wait_for(lambda: second.status(running) == "succeeded")
    assert reopened.forgotten[running_pod] > 1  # an end applied by a sync, acknowledged after it
