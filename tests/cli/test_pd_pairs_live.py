"""Prefill/decode pairs through a real `gpupool up --simulate` on a small fat tree (`--fabric FILE`):
two stand-in engines (HTTP processes) where the prefill one turns a prompt into a payload of the KV
cache's size for its tokens and POSTs it to its decode partner, found in GPUPOOL_PARTNER_ENDPOINTS,
and the decode one acknowledges the bytes. Checked: the replicas' placement (the partner's leaf,
read from the store), each pod's environment, the payload's arrival, and one tenant against
another's pair."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cli_inproc import run_cli
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.write import to_ibnetdiscover
from ports import serving_config
from server.upproc import UpProcess, until

pytestmark = pytest.mark.slow
POD_NETWORK = "10.246.0.0/16"
"""This file's own pod network: pools on one machine must not share one."""
KV_BYTES_PER_TOKEN = 327_680
"""Llama-2-70B: 80 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes."""
ENV_SHOWN = ("GPUPOOL_SERVICE_ROLE", "GPUPOOL_PAIR_WITH", "GPUPOOL_PARTNER_ENDPOINTS", "NCCL_IB_HCA",
             "UCX_NET_DEVICES", "NCCL_IB_SL")
ENGINE = """
import http.server, json, os, urllib.request
SHOWN = __SHOWN__
received = []
class H(http.server.BaseHTTPRequestHandler):
    def answer(self, body, code=200):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == '/healthz':
            return self.answer({})
        if self.path == '/env':
            return self.answer({k: os.environ.get(k) for k in SHOWN})
        if self.path == '/received':
            return self.answer({'payloads': received})
        self.answer({}, 404)
    def do_POST(self):
        body = self.rfile.read(int(self.headers['Content-Length']))
        if self.path == '/kv' and os.environ['GPUPOOL_SERVICE_ROLE'] == 'decode':
            received.append(len(body))
            return self.answer({'acknowledged': len(body)})
        if self.path == '/prompt' and os.environ['GPUPOOL_SERVICE_ROLE'] == 'prefill':
            tokens = len(json.loads(body)['prompt'].split())
            payload = bytes(tokens * __KV__)
            partner = os.environ['GPUPOOL_PARTNER_ENDPOINTS'].split(',')[0]
            request = urllib.request.Request('http://%s/kv' % partner, data=payload, method='POST')
            with urllib.request.urlopen(request, timeout=30) as reply:
                ack = json.load(reply)
            return self.answer({'tokens': tokens, 'sent': len(payload), 'to': partner, 'ack': ack})
        self.answer({}, 404)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('0.0.0.0', int(os.environ['PORT'])), H).serve_forever()
""".replace("__SHOWN__", repr(ENV_SHOWN)).replace("__KV__", str(KV_BYTES_PER_TOKEN))
CONFIG = "scheduling: {placement: first-fit}\nfabric:\n  qos: {serving: 0.6, normal: 0.4}\n"


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    base = tmp_path_factory.mktemp("pd-pairs")
    topology = base / "tree.topo"
    topology.write_text(to_ibnetdiscover(fat_tree(4, levels=2)))  # 4 leaves of 2 hosts, 2 spines
    config = base / "pool.yaml"
    config.write_text(CONFIG + serving_config())
    server = UpProcess(base / "data", ["--simulate", "8x2xH100", "--config", str(config),
                                       "--fabric", str(topology)],
                       env={"GPUPOOL_POD_NETWORK": POD_NETWORK}).start()
    try:
        yield server
    finally:
        _delete_services(server)  # a service's replicas outlive `gpupool up` (a restart adopts them)
        server.stop()


def _delete_services(pool: UpProcess) -> None:
    """Delete every service and wait until the store holds no running pod."""
    with pool.client() as api:
        for service in api.get("/services").json():
            api.delete(f"/services/{service['name']}", params={"tenant": service["tenant"]})

        def quiet() -> bool:
            with sqlite3.connect(pool.data_dir / "gpupool.sqlite") as db:
                return db.execute("SELECT count(*) FROM pods WHERE finished_s IS NULL").fetchone()[0] == 0

        until(quiet, 60, "every service's replicas ended")


def tenant_token(pool: UpProcess, name: str) -> str:
    with pool.client() as api:
        assert api.post("/tenants", json={"name": name}).status_code == 201
        answer = api.post("/tokens", json={"tenant": name})
        assert answer.status_code == 201, answer.text
        return str(answer.json()["token"])


def gp(pool: UpProcess, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env = {**base, "GPUPOOL_URL": pool.url, "GPUPOOL_TOKEN": token}
    return run_cli(args, env)


def shown(pool: UpProcess, token: str, name: str) -> dict[str, Any]:
    result = gp(pool, token, "service", "show", name, "--json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def create(pool: UpProcess, token: str, name: str, role: str, partner: str, replicas: int) -> None:
    created = gp(pool, token, "service", "create", name, "--gpus", "0.25", "--min", str(replicas), "--max",
                 str(replicas), "--role", role, "--pair-with", partner, "--readiness-http", "/healthz",
                 "--probe-period", "0.2", "--", "python3", "-c", ENGINE)
    assert created.returncode == 0, created.stderr
    until(lambda: shown(pool, token, name)["state"] == "ready", 90, f"service {name} ready")


def set_cordon(pool: UpProcess, nodes: list[str], cordoned: bool) -> None:
    with pool.client() as api:
        for node in nodes:
            answer = api.post(f"/nodes/{node}/{'cordon' if cordoned else 'uncordon'}")
            assert answer.status_code == 200, answer.text


def stored_nodes(pool: UpProcess, tenant: str, service: str) -> list[str]:
    """The nodes of the service's running replicas' pods, as the store records them."""
    with sqlite3.connect(pool.data_dir / "gpupool.sqlite") as db:
        rows = db.execute(
            "SELECT p.node FROM pods p JOIN service_replicas r ON r.workload_id = p.workload_id "
            "JOIN services s ON s.id = r.service_id WHERE s.tenant = ? AND s.name = ? "
            "AND p.status = 'running' ORDER BY p.node", (tenant, service)).fetchall()
    return [node for (node,) in rows]


def get(url: str) -> dict[str, Any]:
    return dict(httpx.get(url, timeout=10).json())


def test_a_pair_sits_in_one_leaf_gets_its_environment_and_passes_the_kv_cache(pool: UpProcess) -> None:
    token = tenant_token(pool, "alpha")
    with pool.client() as api:
        leaf_of = {n["node"]: n["leaf"] for n in api.get("/fabric").json()["nodes"]}
    names = sorted(leaf_of)
    last_leaf = leaf_of[names[-1]]
    away = [n for n in names if leaf_of[n] != last_leaf]
    set_cordon(pool, away, True)  # the decode replica goes to the last leaf; first-fit would not
    try:
        create(pool, token, "dec", "decode", "pre", 1)
    finally:
        set_cordon(pool, away, False)
    decode_nodes = stored_nodes(pool, "alpha", "dec")
    assert [leaf_of[n] for n in decode_nodes] == [last_leaf]
    create(pool, token, "pre", "prefill", "dec", 2)
    prefill_nodes = stored_nodes(pool, "alpha", "pre")
    # first-fit alone would put both on the first node, in another leaf; paired they join the decode's
    assert len(prefill_nodes) == 2 and {leaf_of[n] for n in prefill_nodes} == {last_leaf}, prefill_nodes

    dec = shown(pool, token, "dec")["replicas"][0]
    dec_endpoint = f"{dec['host']}:{dec['port']}"
    prefill = shown(pool, token, "pre")["replicas"]
    env = get(f"http://{prefill[0]['host']}:{prefill[0]['port']}/env")
    assert env["GPUPOOL_SERVICE_ROLE"] == "prefill" and env["GPUPOOL_PAIR_WITH"] == "dec"
    assert env["GPUPOOL_PARTNER_ENDPOINTS"] == dec_endpoint
    assert env["NCCL_IB_HCA"] and env["NCCL_IB_HCA"].startswith("=")
    assert env["UCX_NET_DEVICES"] == env["NCCL_IB_HCA"].removeprefix("=")
    assert env["NCCL_IB_SL"] is not None and env["NCCL_IB_SL"].isdigit()
    dec_env = get(f"http://{dec_endpoint}/env")
    assert dec_env["GPUPOOL_SERVICE_ROLE"] == "decode" and dec_env["NCCL_IB_SL"] == env["NCCL_IB_SL"]
    assert dec_env["GPUPOOL_PARTNER_ENDPOINTS"] == ""  # launched before any prefill replica was ready

    prompt = " ".join(["token"] * 12)
    sent = httpx.post(f"http://{prefill[0]['host']}:{prefill[0]['port']}/prompt", json={"prompt": prompt},
                      timeout=60).json()
    assert sent["sent"] == 12 * KV_BYTES_PER_TOKEN and sent["to"] == dec_endpoint
    assert sent["ack"] == {"acknowledged": 12 * KV_BYTES_PER_TOKEN}
    assert get(f"http://{dec_endpoint}/received")["payloads"] == [12 * KV_BYTES_PER_TOKEN]

    # the partners now, through the CLI (the decode's environment was a snapshot from its launch)
    now = gp(pool, token, "service", "partners", "dec")
    assert now.returncode == 0, now.stderr
    assert now.stdout.split() == sorted(f"{r['host']}:{r['port']}" for r in prefill)

    # another tenant: cannot read alpha's partners, and its pair_with never reaches alpha's services
    other = tenant_token(pool, "beta")
    result = gp(pool, other, "service", "partners", "dec")
    assert result.returncode == 3 and "No service 'dec'" in result.stderr, result.stderr
    with httpx.Client(base_url=pool.api, headers={"Authorization": f"Bearer {other}"}, timeout=30) as api:
        assert api.get("/services/pre/partners").status_code == 404
        answer = api.post("/services", json={"name": "spy", "command": ["sleep", "600"], "role": "prefill",
                                            "pair_with": "dec", "min_replicas": 0, "replicas": 0})
        assert answer.status_code == 201, answer.text
        partners = api.get("/services/spy/partners").json()
        assert partners["exists"] is False and partners["endpoints"] == []  # beta has no 'dec'


@pytest.mark.parametrize(("args", "code", "words"), [
    (("create", "x", "--role", "prefill", "--", "true"), 2, "and pair_with go together"),
    (("create", "x", "--role", "middle", "--pair-with", "y", "--", "true"), 2, "prefill"),
    (("create", "x", "--role", "decode", "--pair-with", "x", "--", "true"), 2, "cannot pair with itself"),
    (("partners", "nope"), 3, "No service 'nope'"),
])
def test_bad_pairs_exit_with_the_rule(pool: UpProcess, args: tuple[str, ...], code: int, words: str) -> None:
    result = gp(pool, pool.token(), "service", *args)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert words in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_partner_of_the_same_role_or_none_is_refused_and_an_unpaired_service_has_no_partners(
        pool: UpProcess) -> None:
    admin = pool.token()
    base = ["--min", "0", "--replicas", "0", "--", "sleep", "600"]
    assert gp(pool, admin, "service", "create", "solo", *base).returncode == 0
    assert gp(pool, admin, "service", "create", "p1", "--role", "prefill", "--pair-with", "p2",
              *base).returncode == 0
    same = gp(pool, admin, "service", "create", "p2", "--role", "prefill", "--pair-with", "p1", *base)
    assert same.returncode == 2 and "must name a decode service" in same.stderr, same.stderr
    none = gp(pool, admin, "service", "create", "p3", "--role", "decode", "--pair-with", "solo", *base)
    assert none.returncode == 2 and "has no role" in none.stderr, none.stderr
    unpaired = gp(pool, admin, "service", "partners", "solo")
    assert unpaired.returncode == 2 and "not half of a prefill/decode pair" in unpaired.stderr
    with pool.client() as api:  # role and pair_with are the server's to set on a plain workload
        answer = api.post("/workloads", json={"command": ["true"], "pair_with": "p1"})
        assert answer.status_code == 422 and "set by the server" in answer.json()["message"], answer.text
