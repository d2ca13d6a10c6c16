from conftest import Server


def test_submit_runs_and_succeeds(server: Server) -> None:
    r = server.client.post("/api/v1/workloads", json={"command": ["true"], "resources": {"gpus": 0.25}},
                           headers=server.headers())
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    server.wait_for(lambda: server.status(wid) == "running")
    (pod,) = server.provider.running()
    server.provider.finish(pod, 0)
    server.wait_for(lambda: server.status(wid) == "succeeded")
    events = server.client.get(f"/api/v1/workloads/{wid}/events", headers=server.headers()).json()
    assert [e["to_status"] for e in events] == ["pending", "admitted", "running", "succeeded"]
