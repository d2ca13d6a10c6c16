"""A real `gpupool up`: the admin token goes to its 0600 file and never to the output; /metrics
needs a token unless --metrics-public, which a non-loopback --host refuses."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
from upproc import UpProcess, cli


def test_up_writes_the_admin_token_to_its_file_only_and_guards_metrics(tmp_path: Path) -> None:
    server = UpProcess(tmp_path / "data", ["--provider", "fake", "--simulate", "1x2xH100"]).start()
    try:
        token = server.token()
        path = tmp_path / "data" / "admin-token"
        assert token.startswith("gp_") and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        log = server.log_text()
        assert token not in log and f"Admin token: in {path}" in log
        assert httpx.get(f"{server.url}/metrics", timeout=10).status_code == 401
        with server.client() as admin:
            assert admin.get(f"{server.url}/metrics").status_code == 200
    finally:
        server.stop()
    restarted = UpProcess(tmp_path / "data", ["--provider", "fake", "--simulate", "1x2xH100"]).start()
    try:
        assert restarted.token() == token and token not in restarted.log_text()
    finally:
        restarted.stop()


def test_metrics_public_serves_without_a_token_on_loopback_only(tmp_path: Path) -> None:
    refused = cli(["up", "--data-dir", str(tmp_path / "x"), "--host", "0.0.0.0", "--metrics-public"], {})
    assert refused.returncode == 2 and "loopback" in refused.stderr and "Traceback" not in refused.stderr
    server = UpProcess(tmp_path / "data", ["--provider", "fake", "--simulate", "1x2xH100",
                                           "--metrics-public"]).start()
    try:
        assert httpx.get(f"{server.url}/metrics", timeout=10).status_code == 200
    finally:
        server.stop()
