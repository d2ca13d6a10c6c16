"""`pip install gpupool` is the client, the CLI and the SDK: they run without the server's parts.

The client-side tests run the real entry point in a Python that refuses to import what the
`server` and `ray` extras bring, as a client-only install would, against a live server.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from factories import node
from gpupool.cli.lazy import EXTRA_OF_MODULE
from gpupool.client import Client
from live import LiveServer, live_server
from server.fakes import ManualProvider

ROOT = Path(__file__).resolve().parents[1]
SERVER_PARTS = {"fastapi", "fastapi-offline", "uvicorn", "sqlalchemy", "alembic", "psycopg",
                "prometheus-client", "nvidia-ml-py", "numpy", "scipy", "networkx", "matplotlib", "ray"}
REFUSED = ("fastapi", "starlette", "sqlalchemy", "alembic", "uvicorn", "scipy", "numpy", "networkx",
           "matplotlib", "ray", "psycopg", "prometheus_client", "pynvml")
# Runs `gpupool ARGS` (or, with --sdk, the SDK) where the refused modules cannot be imported.
CLIENT_ONLY = f'''
import importlib.abc, sys

REFUSED = {REFUSED!r}


class ClientOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)


sys.meta_path.insert(0, ClientOnly())
if sys.argv[1:] == ["--sdk"]:
    import gpupool
    from gpupool.client import Client

    with Client() as pool:
        wid = pool.submit(command=["python", "job.py"], gpus=0.25, gpu_memory="1GiB", name="sdk")
        print(wid, pool.workload(wid).spec.resources.gpus, gpupool.__version__)
else:
    from gpupool.cli.main import main

    sys.argv[0] = "gpupool"
    main()
'''


def _normal(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()  # PEP 503


def _requirement_name(line: str) -> str:
    return _normal(re.split(r"[\[<>=!~;\s]", line, maxsplit=1)[0])


def _pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)["project"]  # type: ignore[no-any-return]


def test_the_base_install_names_no_server_part() -> None:
    project = _pyproject()
    base = {_requirement_name(line) for line in project["dependencies"]}  # type: ignore[attr-defined]
    assert base & SERVER_PARTS == set()
    assert {"httpx", "pydantic", "typer", "rich", "pyyaml", "platformdirs", "cloudpickle"} <= base
    extras = project["optional-dependencies"]
    server = {_requirement_name(line) for line in extras["server"]}  # type: ignore[index]
    assert SERVER_PARTS - {"ray"} <= server
    assert "ray[default]==2.60.0" in extras["ray"] and "gpupool[server]" in extras["ray"]  # type: ignore[index]
    assert extras["all"] == ["gpupool[server,ray]"]  # type: ignore[index]
    providers = project["entry-points"]["gpupool.providers"]  # type: ignore[index]
    assert providers["ray"] == "gpupool.providers.ray:RayProvider"
    assert {"local", "fake"} <= set(providers)


def test_every_server_dependency_is_recognised_when_missing() -> None:
    """A command that needs a server part names its extra: every module of the extra is known."""
    modules_of: dict[str, set[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            modules_of.setdefault(_normal(dist), set()).add(module)
    for line in _pyproject()["optional-dependencies"]["server"]:  # type: ignore[index]
        dist = _requirement_name(line)
        assert modules_of.get(dist, set()) & set(EXTRA_OF_MODULE), f"{dist} is missing from EXTRA_OF_MODULE"
    assert set(REFUSED) <= set(EXTRA_OF_MODULE)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    provider = ManualProvider([node("n0", devices=2, model="H100")])  # pods run until cancelled
    with live_server(tmp_path_factory.mktemp("client-only"), provider) as srv:
        yield srv


def client_only(srv: LiveServer | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    if srv is not None:
        env.update(GPUPOOL_URL=srv.url, GPUPOOL_TOKEN=srv.admin_token)
    env["COLUMNS"] = "100"
    return subprocess.run([sys.executable, "-c", CLIENT_ONLY, *args], capture_output=True, text=True, env=env,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_the_sdk_submits_without_server_parts(server: LiveServer) -> None:
    result = client_only(server, "--sdk")
    assert result.returncode == 0, result.stderr
    wid, gpus, _ = result.stdout.split()
    assert float(gpus) == 0.25
    with Client(server.url, server.admin_token) as admin:
        assert admin.workload(wid).name == "sdk"


def test_the_cli_submits_lists_shows_and_cancels_without_server_parts(server: LiveServer) -> None:
    submitted = client_only(server, "submit", "--gpus", "0.5", "--name", "cli-only", "--", "sleep", "60")
    assert submitted.returncode == 0, submitted.stderr
    wid = submitted.stdout.strip()
    listed = client_only(server, "ls")
    assert listed.returncode == 0 and wid[:8] in listed.stdout, listed.stderr
    shown = client_only(server, "show", wid, "--json")
    assert shown.returncode == 0 and '"cli-only"' in shown.stdout, shown.stderr
    cancelled = client_only(server, "cancel", wid)
    assert cancelled.returncode == 0, cancelled.stderr
    assert client_only(server, "show", wid, "--json").stdout.count('"status": "cancelled"') == 1
    config = client_only(server, "config", "show", "--server")
    assert config.returncode == 0 and "placement:" in config.stdout, config.stderr


@pytest.mark.parametrize("command", ["submit", "ls", "show", "logs", "cancel", "wait"])
def test_client_commands_have_help_without_server_parts(command: str) -> None:
    result = client_only(None, command, "--help")
    assert result.returncode == 0, result.stderr
    assert f"gpupool {command}" in result.stdout


@pytest.mark.parametrize(("args", "command"), [(["up"], "gpupool up"), (["sim", "fill"], "gpupool sim fill"),
                                               (["up", "--port", "1"], "gpupool up")])
def test_a_server_command_without_the_extra_says_what_to_install(args: list[str], command: str) -> None:
    result = client_only(None, *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert re.fullmatch(rf"Error: `{command}` needs gpupool's server extra \(No module named '\w+'\); "
                        r"install it with pip install 'gpupool\[server\]'\.\n", result.stderr), result.stderr
