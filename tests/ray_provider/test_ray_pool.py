"""The ray provider on a real Ray cluster of three simulated nodes on this machine.

The tests share one cluster (conftest.pool) and run in file order; the last one kills a node.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="the ray provider needs Ray (pip install 'gpupool[ray]')")

import ray

from gpupool.agent.podstate import load_record, process_alive
from gpupool.core.model import Slice
from gpupool.errors import InvalidInput, NotFound
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.ray import RayProvider
from gpupool.providers.ray.nodeconfig import node_agent_name, pod_actor_name
from gpupool.providers.ray.resources import compute_resource, memory_resource
from gpupool.providers.ray.settings import ADDRESS_FILE, NAMESPACE, NODE_LABEL

from .conftest import given_pool_id, wait_for


def _pod(pod_id: str, node: str, *command: str, slices: tuple[Slice, ...] = (Slice(0, 250, 1024),),
         workload_id: str = "w") -> PodLaunch:
    return PodLaunch(pod_id=pod_id, workload_id=workload_id, node=node, command=command, slices=slices)


def _status(provider: RayProvider, pod_id: str) -> PodStatus:
    return {s.pod_id: s for s in provider.poll()}[pod_id]


def _final(provider: RayProvider, pod_id: str, timeout_s: float = 60.0) -> PodStatus:
    status = wait_for(lambda: (s := _status(provider, pod_id)).phase.is_final and s, timeout_s,
                      f"pod {pod_id} to end")
    assert isinstance(status, PodStatus)
    return status


def _wait_running(provider: RayProvider, *pod_ids: str) -> None:
    for pod_id in pod_ids:
        wait_for(lambda: _status(provider, pod_id).phase is PodPhase.RUNNING,  # noqa: B023 (used at once)
                 what=f"pod {pod_id} to run")


def _names(pool: RayProvider) -> list[str]:
    return [n.name for n in pool.nodes()]


def test_nodes_come_from_ray_labelled_and_with_one_resource_per_device(pool: RayProvider) -> None:
    assert _names(pool) == ["t4-000", "t4-001", "t4-002"]
    assert (pool.data_dir / ADDRESS_FILE).read_text().strip() == pool.address
    by_name = {e["Labels"][NODE_LABEL]: e for e in ray.nodes() if e["Alive"] and NODE_LABEL in e["Labels"]}
    for node in pool.nodes():
        resources = by_name[node.name]["Resources"]
        assert resources.get("GPU", 0) == 0
        assert [resources[compute_resource(node.name, d.index)] for d in node.devices] == [1000.0, 1000.0]
        assert pool.node_address(node.name) == by_name[node.name]["NodeManagerAddress"]
    with pytest.raises(NotFound):
        pool.node_address("no-such-node")


def test_ray_processes_run_without_the_memory_monitor_and_with_their_own_cuda_handling(
        pool: RayProvider) -> None:
    agent = ray.get_actor(node_agent_name("t4-000"), namespace=NAMESPACE)
    env: Any = ray.get(agent.process_env.remote(["RAY_memory_monitor_refresh_ms", "RAY_AUTH_MODE",
                                            "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]))
    assert env == {"RAY_memory_monitor_refresh_ms": "0", "RAY_AUTH_MODE": "token",
                   "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
    head = pool._head
    assert head is not None and len(str(head.temp_dir)) < 30
    sockets = list(head.temp_dir.glob("session_*/sockets/*"))
    assert sockets and all(len(str(s)) < 107 for s in sockets)


def test_no_other_account_can_reach_a_nodes_ray_sockets_and_logs(pool: RayProvider) -> None:
    """Ray makes its temp dir and the session's sockets and logs directories writable by everyone
    (no sticky bit): a pod running as a tenant's account could delete or replace the raylet's
    sockets, or plant names among the logs Ray's processes open. Each node's temp dir sits in a
    directory only the pool's account may enter."""
    nodes = [pool._head, *(j.process for j in pool.joined)]
    assert all(node is not None for node in nodes) and len(nodes) >= 2
    for node in nodes:
        assert node is not None
        assert list(node.temp_dir.glob("session_*/sockets/*")), node.temp_dir
        private = node.temp_dir.parent
        assert private.name.startswith("gpr-") and private.stat().st_uid == os.geteuid()
        assert stat.S_IMODE(private.stat().st_mode) == 0o700, oct(private.stat().st_mode)


def test_each_pod_runs_on_the_node_asked_with_the_environment_gpupool_built(pool: RayProvider) -> None:
    for node in pool.nodes():
        pod_id = f"env-{node.name}"
        pool.launch(_pod(pod_id, node.name, "sh", "-c", "env", slices=(Slice(1, 500, 2048),)))
        status = _final(pool, pod_id)
        assert (status.phase, status.exit_code, status.node) == (PodPhase.SUCCEEDED, 0, node.name)
        ran_on = [j.config.name for j in pool.joined if (j.config.agent_dir() / "pods" / pod_id).is_dir()]
        assert ran_on == [node.name]  # started by that node's agent, no other
        env = dict(line.split("=", 1) for line in pool.read_log(pod_id).text.splitlines() if "=" in line)
        assert env["CUDA_VISIBLE_DEVICES"] == node.devices[1].uuid  # gpupool's, not Ray's
        assert env["GPUPOOL_NODE"] == node.name and env["GPUPOOL_DEVICE_MILLI"] == "500"
        assert not [k for k in env if k.startswith("RAY_")]
        assert env["HOME"].endswith(pod_id)
        if os.geteuid() == 0:
            assert env["USER"] == f"gpupool-{given_pool_id(pool)}-default"


def test_a_pod_that_cannot_fit_waits_on_its_node_and_then_fails_with_the_reason(pool: RayProvider) -> None:
    pool.launch(_pod("full-1", "t4-001", "sleep", "60", slices=(Slice(0, 1000, 0),)))
    _wait_running(pool, "full-1")
    short = RayProvider(pool.address, data_dir=pool.data_dir, placement_timeout_s=3.0)
    try:
        short.launch(_pod("full-2", "t4-001", "true", slices=(Slice(0, 1000, 0),)))
        status = _final(short, "full-2")
        assert status.phase is PodPhase.FAILED and status.node == "t4-001"
        assert "could not place" in status.message and "t4-001" in status.message
        assert _group_state("full-2") in ("REMOVED", "")  # removed, never started anywhere else
        assert not [j for j in pool.joined if (j.config.agent_dir() / "pods" / "full-2").exists()]
    finally:
        short.close()
    pool.stop("full-1", grace_s=1.0)
    assert _final(pool, "full-1").phase is PodPhase.STOPPED


def test_logs_and_exit_codes(pool: RayProvider) -> None:
    pool.launch(_pod("exit-3", "t4-000", "sh", "-c", "echo first; echo second; exit 3"))
    status = _final(pool, "exit-3")
    assert (status.phase, status.exit_code) == (PodPhase.FAILED, 3)
    chunk = pool.read_log("exit-3")
    assert chunk.text == "first\nsecond\n" and chunk.finished
    assert pool.read_log("exit-3", offset=6).text == "second\n"
    with pytest.raises(InvalidInput):
        pool.read_log("exit-3", stream="stdin")
    with pytest.raises(NotFound):
        pool.read_log("never-launched")


def test_checkpoint_marks_of_a_batch_come_from_every_node_in_one_round(pool: RayProvider) -> None:
    """What the scheduler asks before a cycle's transaction: one call per node for all the workloads
    it stops, each answered with its latest mark on any node (None where no node has one)."""
    for n, node in enumerate(_names(pool)[:2]):
        pool.launch(_pod(f"mark-{n}", node, "sh", "-c", f'touch -d @{1_700_000_000 + 600 * n} '
                         '"$GPUPOOL_CHECKPOINT_DIR/.checkpoint"', workload_id=f"w-mark{n}"))
        assert _final(pool, f"mark-{n}").exit_code == 0
    marks = pool.checkpoint_marks(["w-mark0", "w-mark1", "w-none"])
    assert marks == {"w-mark0": 1_700_000_000.0, "w-mark1": 1_700_000_600.0, "w-none": None}
    assert marks["w-mark1"] == pool.checkpoint_s("w-mark1")


def test_stop_terminates_the_whole_group_then_kills_it_after_the_grace(pool: RayProvider) -> None:
    pool.launch(_pod("polite", "t4-002", "sleep", "60"))
    pool.launch(_pod("stubborn", "t4-002", "sh", "-c", "trap '' TERM; echo armed; sleep 60 & wait; wait"))
    _wait_running(pool, "polite", "stubborn")
    # running is not yet ignoring SIGTERM: a stop before the shell ran its trap ended it with 143
    wait_for(lambda: "armed" in pool.read_log("stubborn").text, what="the stubborn pod's trap")
    pool.stop("polite", grace_s=5.0)
    pool.stop("stubborn", grace_s=0.5)
    pool.stop("stubborn", grace_s=0.5)
    assert (_final(pool, "polite").phase, _final(pool, "polite").exit_code) == (PodPhase.STOPPED, 143)
    assert (_final(pool, "stubborn").phase, _final(pool, "stubborn").exit_code) == (PodPhase.STOPPED, 137)


def test_a_running_pods_group_holds_its_slice_on_its_node_only(pool: RayProvider) -> None:
    pool.launch(_pod("held", "t4-001", "sleep", "60", slices=(Slice(1, 750, 1024),)))
    _wait_running(pool, "held")
    table = ray.util.placement_group_table(ray.util.get_placement_group(pod_actor_name("held")))
    assert table["state"] == "CREATED" and table["stats"] is not None
    assert list(table["bundles_to_node_id"].values()) == [pool.membership.ray_node("t4-001").node_id]  # type: ignore[union-attr]
    bundle = table["bundles"][0]
    assert bundle[compute_resource("t4-001", 1)] == 750.0 and bundle[memory_resource("t4-001", 1)] == 1024.0
    pool.stop("held", grace_s=1.0)
    assert _final(pool, "held").phase is PodPhase.STOPPED


def _group_state(pod_id: str) -> str:
    """The state of the pod's placement group ('' when Ray no longer knows its name)."""
    try:
        group = ray.util.get_placement_group(pod_actor_name(pod_id))
    except ValueError:
        return ""
    return str(ray.util.placement_group_table(group)["state"])


def test_a_finished_pod_releases_its_slice_and_its_log_outlives_it(pool: RayProvider) -> None:
    pool.launch(_pod("whole", "t4-000", "sh", "-c", "echo done", slices=(Slice(0, 1000, 0),)))
    _final(pool, "whole")

    def released() -> bool:
        pool.poll()
        return _group_state("whole") in ("REMOVED", "")

    wait_for(released, what="the finished pod's placement group to be removed")
    assert pool.read_log("whole").text == "done\n"
    pool.launch(_pod("whole-again", "t4-000", "true", slices=(Slice(0, 1000, 0),)))
    assert _final(pool, "whole-again").phase is PodPhase.SUCCEEDED


def test_an_acknowledged_pod_is_released_at_once_and_forgotten_by_its_node_agent(pool: RayProvider) -> None:
    pool.launch(_pod("acked", "t4-002", "sh", "-c", "echo acked"))
    assert _final(pool, "acked").phase is PodPhase.SUCCEEDED  # one poll: no release by poll count yet
    agent = pool.agent("t4-002")

    def agent_lists() -> set[str]:
        return {s.pod_id for s in ray.get(agent.__ray_call__.remote(lambda a: a.local.poll()), timeout=30)}

    assert "acked" in agent_lists()
    pool.forget_pods(["acked"])
    assert "acked" not in {s.pod_id for s in pool.poll()}
    wait_for(lambda: _group_state("acked") in ("REMOVED", ""), what="the acknowledged pod's group to go")
    wait_for(lambda: "acked" not in agent_lists(), what="the node agent to forget the pod")
    status = ray.get(agent.statuses.remote(["acked"]), timeout=30)["acked"]
    assert (status.phase, status.exit_code) == (PodPhase.SUCCEEDED, 0), "still known by id"
    assert pool.read_log("acked").text == "acked\n"


def test_a_node_agents_watch_answers_with_a_pods_end_and_reports_pods_it_never_ran_lost(
        pool: RayProvider, pod_scratch_root: Path) -> None:
    gate = pod_scratch_root / "gate"  # pods run as another account: a directory open to them
    agent = pool.agent("t4-001")
    command = ("sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 3")
    first = ray.get(agent.launch.remote(_pod("watched", "t4-001", *command)), timeout=30)
    assert first.phase is PodPhase.RUNNING
    unchanged = ray.get(agent.watch.remote({"watched": PodPhase.RUNNING}, 0.2), timeout=30)
    assert unchanged["watched"].phase is PodPhase.RUNNING  # nothing changed: answered at its wait's end
    watching = agent.watch.remote({"watched": PodPhase.RUNNING, "never-ran": PodPhase.RUNNING}, 30.0)
    gate.touch()
    seen = ray.get(watching, timeout=30)
    assert seen["never-ran"].phase is PodPhase.LOST  # already differs from what the caller knew
    ended = wait_for(lambda: (s := ray.get(agent.watch.remote({"watched": PodPhase.RUNNING}, 2.0),
                                            timeout=30)["watched"]).phase.is_final and s, 30.0,
                     "the watched pod's end")
    assert isinstance(ended, PodStatus) and ended.phase is PodPhase.FAILED and ended.exit_code == 3


def test_a_second_provider_re_adopts_running_pods_and_never_starts_them_twice(
        pool: RayProvider, pod_scratch_root: Path) -> None:
    marks = pod_scratch_root / "starts"  # pods run as another account: pytest's tmp_path is closed to it
    marks.mkdir()
    marks.chmod(0o777)
    command = ("sh", "-c", f"echo started >> {marks}/log; sleep 60")
    pool.launch(_pod("adopted", "t4-001", *command))
    _wait_running(pool, "adopted")
    # its start marker written (running is said once the process is, before the shell's echo): the
    # stop below must not land before it, or the log would miss the one start it counts
    log = marks / "log"
    wait_for(lambda: log.exists() and log.read_text().endswith("\n"), 30.0, "the pod's start marker")
    second = RayProvider(pool.address, data_dir=pool.data_dir)
    try:
        assert _status(second, "adopted").phase is PodPhase.RUNNING
        assert _status(second, "adopted").node == "t4-001"
        second.launch(_pod("adopted", "t4-001", *command))
        second.stop("adopted", grace_s=2.0)
        assert _final(second, "adopted").phase is PodPhase.STOPPED
        assert (marks / "log").read_text() == "started\n"
    finally:
        second.close()
    assert pool.head_is_owned  # the second provider attached: it started no cluster of its own


def test_a_restarted_node_agent_re_adopts_its_running_pods(pool: RayProvider) -> None:
    pool.launch(_pod("kept", "t4-000", "sleep", "60"))
    _wait_running(pool, "kept")
    agent = ray.get_actor(node_agent_name("t4-000"), namespace=NAMESPACE)
    first_pid: Any = ray.get(agent.pid.remote())
    ray.kill(agent, no_restart=False)  # Ray starts it again; it reads its pods back from its state dir
    wait_for(lambda: ray.get(agent.pid.remote()) != first_pid, 60.0, "the agent to start again")
    status: Any = ray.get(agent.statuses.remote(["kept"]))["kept"]
    assert status.phase is PodPhase.RUNNING and "re-adopted" in status.message
    pool.stop("kept", grace_s=5.0)
    assert (_final(pool, "kept").phase, _final(pool, "kept").exit_code) == (PodPhase.STOPPED, 143)


def test_a_machine_joins_with_the_cli_runs_work_and_leaves(pool: RayProvider, tmp_path: Path) -> None:
    gpupool = [sys.executable, "-m", "gpupool.cli.main"]
    state = tmp_path / "extra"
    join = subprocess.Popen([*gpupool, "node", "join", "--ray-address", pool.address, "--simulate", "1xT4",
                             "--name", "extra-1", "--ray-token-file", str(pool.token_path),
                             "--state-dir", str(state)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        wait_for(lambda: "extra-1" in _names(pool) or join.poll() is not None, 90.0, "the node to join")
        assert join.poll() is None, join.stdout.read() if join.stdout else ""
        pool.launch(_pod("on-extra", "extra-1", "sh", "-c", "echo $GPUPOOL_NODE; id -un"))
        assert _final(pool, "on-extra").phase is PodPhase.SUCCEEDED
        # the joiner read the pool's id from the cluster: its pods run as the pool's accounts
        account = f"gpupool-{given_pool_id(pool)}-default" if os.geteuid() == 0 \
            else pwd.getpwuid(os.geteuid()).pw_name
        assert pool.read_log("on-extra").text == f"extra-1\n{account}\n"
        left = subprocess.run([*gpupool, "node", "leave", "--name", "extra-1", "--state-dir", str(state)],
                              capture_output=True, text=True, timeout=120)
        assert left.returncode == 0 and "left the pool" in left.stdout, left.stdout + left.stderr
        assert join.wait(timeout=60) == 0
        wait_for(lambda: "extra-1" not in _names(pool), what="the node to leave")
    finally:
        if join.poll() is None:
            join.kill()
    output = join.stdout.read() if join.stdout else ""
    assert "Node extra-1 joined the Ray cluster" in output and "1 simulated device(s) (T4)" in output


def test_a_killed_node_leaves_the_pool_before_its_pods_are_reported_lost(pool: RayProvider) -> None:
    pool.launch(_pod("doomed", "t4-002", "sleep", "600"))  # outlives the wait below unless ended
    pool.launch(_pod("survivor", "t4-000", "sleep", "60"))
    _wait_running(pool, "doomed", "survivor")
    victim = next(j for j in pool.joined if j.config.name == "t4-002")
    doomed = load_record(pool._carriers[pool.pod_carrier].state_file(victim.config, "doomed"))
    assert not isinstance(doomed, str) and doomed.pid is not None
    victim.process.kill()
    seen: list[tuple[bool, PodPhase]] = []

    def lost() -> bool:
        present = "t4-002" in _names(pool)
        phase = _status(pool, "doomed").phase
        seen.append((present, phase))
        return phase is PodPhase.LOST

    wait_for(lost, what="the killed node's pod to be reported lost")
    first_lost = next(i for i, (_, phase) in enumerate(seen) if phase is PodPhase.LOST)
    assert first_lost >= 2 and not any(present for present, _ in seen[first_lost - 2:])
    assert "t4-002" in _status(pool, "doomed").message
    # its process outlived the node's agent (its own session): the provider ended it, by its marker
    wait_for(lambda: not process_alive(doomed.pid, doomed.start_ticks), 30, "the lost pod's process to end")
    assert _names(pool) == ["t4-000", "t4-001"]
    assert _status(pool, "survivor").phase is PodPhase.RUNNING
    pool.stop("survivor", grace_s=1.0)
    assert _final(pool, "survivor").phase is PodPhase.STOPPED


def test_the_server_requeues_work_of_a_killed_node_and_places_it_on_another(pool: RayProvider) -> None:
    from gpupool.client import Client
    from live import live_server

    provider = RayProvider(pool.address, data_dir=pool.data_dir)
    with live_server(pool.data_dir / "server", provider) as server, \
            Client(server.url, server.admin_token) as client:
        wid = client.submit({"command": ["sleep", "60"], "resources": {"gpus": 0.5}})

        def running_on() -> str:
            workload = client.workload(wid)
            live = [p for p in workload.pods if p.status == "running"]
            return live[0].node if workload.status == "running" and live else ""

        first = str(wait_for(running_on, what="the workload to run"))
        next(j for j in pool.joined if j.config.name == first).process.kill()
        second = str(wait_for(lambda: (node := running_on()) != first and node, 90.0,
                              "the workload to run again on another node"))
        assert second in _names(pool)
        wait_for(lambda: first not in _names(pool), 30.0, "this provider to see the node gone too")  # each
        # provider reads Ray's node table on its own schedule: the server's may have seen it first
        assert "node_lost" in [e.reason for e in client.events(wid)]
        assert client.workload(wid).attempt == 2
        client.cancel(wid)
        assert client.wait(wid, timeout_s=60).status == "cancelled"
    provider.close()
