"""The dashboard's fabric page in a real Chromium against a real `gpupool up --fabric FILE`: levels of
switches above the pool's nodes, every cable drawn and listed, the path of a running gang chosen
with the keyboard, and a cable failed through the API shown failed without a reload."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.write import to_ibnetdiscover
from server.upproc import UpProcess, until
from ui.browser import Watched, screenshot
from ui.test_dashboard import _log_in, _not_reloaded, _status, _submit, _tenant_token

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fabric_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    base = tmp_path_factory.mktemp("ui-fabric")
    topology = base / "tree.topo"
    topology.write_text(to_ibnetdiscover(fat_tree(4, levels=2)))  # 4 leaves of 2 hosts, 2 spines
    server = UpProcess(base / "data", ["--simulate", "8x2xH100", "--placement", "first-fit",
                                       "--fabric", str(topology)]).start()
    try:
        yield server
    finally:
        server.stop()


def _fabric(pool: UpProcess, **params: str) -> dict[str, Any]:
    with pool.client() as api:
        answer = api.get("/fabric", params=params)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


def test_fabric_page_draws_levels_cables_a_gang_path_and_a_failed_cable(
        fabric_pool: UpProcess, browser_page: Watched, gate_dir: Path) -> None:
    pool = fabric_pool
    token = _tenant_token(pool, "net")
    gate = gate_dir / "go"
    # three pods of two devices: more than the two hosts under one leaf, so the gang crosses a spine
    gang = _submit(pool, token, name="allreduce", replicas=3, resources={"gpus": 2},
                   command=["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"])
    try:
        until(lambda: _status(pool, gang) == "running", 60, "the gang running")
        fabric = _fabric(pool)
        page = _log_in(browser_page, pool, pool.token(), "/ui/fabric")
        page.wait_for_selector("svg.fabric")
        assert page.locator("#nav a[data-page=fabric]").is_visible()  # a pool with a fabric shows its tab
        assert page.locator("svg.fabric g.box.sw").count() == len(fabric["switches"]) == 6
        assert page.locator("svg.fabric g.box.nd").count() == len(fabric["nodes"]) == 8
        assert page.locator("svg.fabric line.lk").count() == len(fabric["links"])
        labels = page.locator("svg.fabric .row-label").all_text_contents()
        assert labels == ["spine (1)", "leaf (0)", "nodes"]  # levels as rows, the top tier first
        assert page.locator("#fabric-picture svg").get_attribute("role") == "img"
        assert "6 switches in 2 levels" in (page.locator("#fabric-summary").text_content() or "")
        # choose the gang with the keyboard: its path is drawn and described
        page.focus("#fabric-gang")
        page.keyboard.press("ArrowDown")
        path = _fabric(pool, workload=gang)["gang"]
        assert path["domain"] == "spine" and len(path["links"]) >= 4
        page.locator("#fabric-gang-facts [data-field=bottleneck]").wait_for()
        until(lambda: page.locator("svg.fabric line.lk-path").count() == len(path["links"]), 10,
              "the path drawn")
        drawn = {page.locator("svg.fabric line.lk-path").nth(i).get_attribute("data-link")
                 for i in range(len(path["links"]))}
        assert drawn == set(path["links"])
        assert page.locator("svg.fabric g.box.nd.on-path").count() == 3
        assert page.locator("#fabric-gang-facts [data-field=spans]").text_content() == "spine"
        # a cable fails (off the gang's path, so the gang keeps running): marked without a reload
        spare = next(lk["id"] for lk in fabric["links"]
                     if lk["kind"] == "switch" and lk["id"] not in path["links"])
        with pool.client() as api:
            assert api.post("/fabric/links/fail", json={"link": spare}).status_code == 200
        page.locator(f"svg.fabric line[data-link='{spare}'][data-state=failed]").wait_for()
        page.locator(f"tbody [data-link='{spare}'][data-state=failed]").wait_for()
        assert "1 failed" in (page.locator("#fabric-summary").text_content() or "")
        # telemetry says another cable is 90 % loaded: drawn and listed as congested
        hot = next(lk for lk in fabric["links"]
                   if lk["kind"] == "switch" and lk["id"] not in (spare, *path["links"]))
        with pool.client() as api:
            sample = {"node": hot["a"], "port": hot["a_port"], "utilization": 0.9}
            assert api.post("/fabric/telemetry", json={"ports": [sample]}).status_code == 200
        page.locator(f"svg.fabric line[data-link='{hot['id']}'][data-state=congested]").wait_for()
        assert "1 busy or congested" in (page.locator("#fabric-summary").text_content() or "")
        _not_reloaded(page)
        screenshot(page, "fabric")
        browser_page.assert_clean()
        with pool.client() as api:
            assert api.post("/fabric/links/heal", json={"link": spare}).status_code == 200
    finally:
        gate.touch()
    until(lambda: _status(pool, gang) == "succeeded", 60, "the gang finishing")
