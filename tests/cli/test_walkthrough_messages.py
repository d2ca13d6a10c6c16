"""What a user walking through a local pool met: submissions the pool accepted and then failed or
changed without a word (a relative --workdir, a variable the pool sets itself), and refusals that
named internal fields, quoted pydantic or PyYAML, or said the wrong thing. Each is now refused at
once, in one sentence, in the user's terms."""

from __future__ import annotations

import http.server
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from cli.cliproc import gpupool, one_line_error
from cli_inproc import run_cli
from factories import node
from gpupool.client import Client
from live import LiveServer, live_server
from server.fakes import ManualProvider
from server.upproc import until


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, ManualProvider]]:
    provider = ManualProvider([node("n0", devices=4, model="H100")])
    with live_server(tmp_path_factory.mktemp("walkthrough"), provider) as server, \
            Client(server.url, server.admin_token) as pool:
        pool.create_tenant("alice")
        pool.create_tenant("bob")
        yield server, provider


def g(srv: tuple[LiveServer, ManualProvider], *args: str) -> subprocess.CompletedProcess[str]:
    return gpupool(srv[0].url, srv[0].admin_token, *args)


# ---- 1. a relative --workdir (the pod failed with exit 126 once placed)

def test_a_relative_workdir_is_refused_at_submit(srv: tuple[LiveServer, ManualProvider]) -> None:
    one_line_error(g(srv, "submit", "--workdir", "relative", "--", "true"), 2,
                   "Error: --workdir must be an absolute path such as /home/me/project, not 'relative'.")
    with Client(srv[0].url, srv[0].admin_token) as pool:  # the SDK and the API: the same model
        with pytest.raises(Exception, match="must be an absolute path"):
            pool.submit({"command": ["true"], "workdir": "data/run1"})
        assert pool.submit({"command": ["true"], "workdir": "/tmp"}).startswith("w-")


# ---- 2. a variable the pool sets itself (the pod got the pool's value without a word)

@pytest.mark.parametrize("name", ["GPUPOOL_TENANT", "GPUPOOL_WORKLOAD_ID", "GPUPOOL_CHECKPOINT_DIR",
                                  "GPUPOOL_SUBMIT_DIR"])
def test_a_variable_the_pool_sets_is_refused(srv: tuple[LiveServer, ManualProvider], name: str) -> None:
    one_line_error(g(srv, "submit", "--env", f"{name}=bob", "--", "env"), 2,
                   f"Error: --env holds {name}, which the pool sets itself in the pods it runs; ")


def test_the_pools_variables_are_refused_by_every_model_and_others_of_its_prefix_kept() -> None:
    from gpupool.api.calls import SessionCreate
    from gpupool.api.services import ServiceSpec
    from gpupool.api.workloads import WorkloadSpec

    for model, base in ((WorkloadSpec, {"command": ["x"]}), (ServiceSpec, {"name": "web", "command": ["x"]}),
                        (SessionCreate, {"python": "3.11"})):
        with pytest.raises(ValidationError, match="holds GPUPOOL_POD_ID, which the pool sets itself"):
            model.model_validate({**base, "env": {"GPUPOOL_POD_ID": "p"}})
        # the fake provider's knobs, and the API's address and token for a pod that calls the API
        kept = {"GPUPOOL_FAKE_DURATION_S": "1", "GPUPOOL_URL": "http://h:1", "GPUPOOL_TOKEN": "t"}
        model.model_validate({**base, "env": kept})


# ---- 3. an unknown tenant (was: "Tenant 'nobody' has no queue 'default'. Known queues: none.")

def test_an_unknown_tenant_is_said_so(srv: tuple[LiveServer, ManualProvider]) -> None:
    one_line_error(g(srv, "submit", "--tenant", "nobody", "--", "true"), 3,
                   "Error: No tenant 'nobody'; list the tenants with `gpupool tenant ls`.")


# ---- 4. services

@pytest.mark.parametrize(("args", "sentence"), [
    (("create", "web", "--probe-period", "-1", "--", "x"),
     "--probe-period takes seconds from 0.1 to 3600, got -1."),
    (("create", "web", "--probe-period", "0", "--", "x"),
     "--probe-period takes seconds from 0.1 to 3600, got 0."),
    (("create", "web", "--readiness-tcp", "--probe-period", "-1", "--", "x"),
     "--probe-period takes seconds from 0.1 to 3600, got -1."),
    (("create", "web", "--probe-period", "5", "--", "x"),
     "--probe-period sets how often the probes given with"),
    (("create", "web", "--min", "3", "--max", "1", "--", "x"),
     "--min 3 is above --max 1; the fewest replicas cannot exceed the most."),
    (("create", "web", "--min", "3", "--", "x"), "--min 3 is above --max 1 (the default); "),
    (("create", "web", "--cpu", "-1", "--", "x"), "--cpu must not be negative (got '-1')."),
    (("update", "web", "--max", "1", "--min", "2"), "--min 2 is above --max 1; "),
    (("scale", "web", "-1"), "REPLICAS must be 0 or more, not a negative number."),
])
def test_service_refusals_name_the_flags(srv: tuple[LiveServer, ManualProvider], args: tuple[str, ...],
                                         sentence: str) -> None:
    one_line_error(g(srv, "service", *args), 2, "Error: " + sentence)


def test_a_services_whole_spec_rule_reads_without_pydantics_prefix(
        srv: tuple[LiveServer, ManualProvider]) -> None:
    assert g(srv, "service", "create", "web", "--max", "2", "--", "x").returncode == 0
    line = one_line_error(g(srv, "service", "update", "web", "--min", "3"), 2,
                          "Error: The updated service would be invalid: min_replicas (3) is above "
                          "max_replicas (2)")
    assert "Value error" not in line


# ---- 5. small messages

@pytest.mark.parametrize(("args", "sentence"), [
    (("--cpu", "-1"), "--cpu must not be negative (got '-1')."),
    (("--gpus", "1e400"), "Option --gpus got '1e400', which is too large; "),
    (("--memory", "10EiB"), "--memory '10EiB' is more memory than any machine has; "),
    (("--name", "ünïcødé"), "--name is 'ünïcødé', but a name may hold ASCII letters, "),
])
def test_submit_refusals_in_the_users_terms(srv: tuple[LiveServer, ManualProvider], args: tuple[str, ...],
                                            sentence: str) -> None:
    one_line_error(g(srv, "submit", *args, "--", "true"), 2, "Error: " + sentence)


@pytest.mark.parametrize("value", ["inf", "1e400"])
def test_an_infinite_quota_is_not_a_number_of_devices(srv: tuple[LiveServer, ManualProvider],
                                                      value: str) -> None:
    one_line_error(g(srv, "queue", "set", "alice", "default", "--quota", value), 2,
                   f"Error: --quota must be a finite number of devices (got '{value}'); for no limit, give "
                   "'none'.")


def test_a_mistyped_short_model_name_is_matched_to_its_alias() -> None:
    from gpupool.errors import UnknownName
    from gpupool.profiles import load_profiles

    with pytest.raises(UnknownName, match=r"Did you mean 'H100' \(H100-SXM-80GB\)\?$"):
        load_profiles().get_profile("H1000")


# ---- 6. a spec file's YAML error: one sentence with the line and column

def test_a_yaml_error_is_one_sentence(srv: tuple[LiveServer, ManualProvider], tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("command: [a,\n  b: {]\n")
    one_line_error(g(srv, "submit", "-f", str(spec)), 2,
                   f"Error: Spec file {spec} is not valid YAML at line 2, column 7: expected the node "
                   "content, but found ']' (while parsing a flow node).")


# ---- 7. no token, a server that is not gpupool, a URL with a path

def test_no_token_says_how_the_cli_takes_one(srv: tuple[LiveServer, ManualProvider], tmp_path: Path) -> None:
    env = {**os.environ, "GPUPOOL_URL": srv[0].url, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path),
           "XDG_DATA_HOME": str(tmp_path)}
    env.pop("GPUPOOL_TOKEN", None)
    for args in (["ls"], ["submit", "--", "true"]):
        one_line_error(run_cli(args, env), 3,
                       f"Error: No token given: set GPUPOOL_TOKEN (tokens come from `gpupool token create`), "
                       f"or write token = \"...\" in {tmp_path}/gpupool/config.toml; ")


@pytest.fixture
def not_gpupool() -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *_: object) -> None:  # the CLI runs in this process: its stderr is checked
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_a_server_that_is_not_gpupool_is_named(not_gpupool: str) -> None:
    for args in (["ls"], ["submit", "--", "true"]):
        result = gpupool(not_gpupool, "gp_x", *args)
        assert result.returncode != 0 and result.stdout == "", result
        assert result.stderr.startswith(f"Error: The server at {not_gpupool} answered HTTP "), result.stderr
        assert "it does not look like a gpupool server; check the URL (GPUPOOL_URL)." in result.stderr


def test_a_url_with_a_wrong_path_is_said_to_be_maybe_wrong(srv: tuple[LiveServer, ManualProvider]) -> None:
    for args in (["ls"], ["submit", "--", "true"]):
        result = gpupool(srv[0].url + "/foo", srv[0].admin_token, *args)
        one_line_error(result, 3, f"Error: No such API path at {srv[0].url}/foo: the URL may be wrong "
                       "(check GPUPOOL_URL")


# ---- 8. ls: the title of several tenants' work, and no node for pending work

def test_ls_title_and_a_requeued_workloads_node(srv: tuple[LiveServer, ManualProvider]) -> None:
    server = srv[0]
    with Client(server.url, server.admin_token) as pool:
        alice = pool.submit({"command": ["true"], "tenant": "alice", "resources": {"gpus": 1}})
        bob = pool.submit({"command": ["true"], "tenant": "bob", "resources": {"gpus": 1}})
        until(lambda: pool.workload(bob).status == "running", 30, "bob's work to run")
        pool.requeue(bob, hold=True)
        until(lambda: pool.workload(bob).status == "pending", 30, "bob's work to be pending")
        assert pool.workload(bob).pods, "the API still lists the last attempt's pods"
    listed = g(srv, "ls", "-t", "bob,alice", "--limit", "1")  # bob's, the newest
    assert listed.returncode == 0, listed.stderr
    title = listed.stdout.splitlines()[0].strip()
    assert title.endswith(", those shown in bob/default"), title
    row = next(line for line in listed.stdout.splitlines() if line.startswith(bob))
    assert row.split()[4] == "-", row  # NODE: a pending workload holds none
    pinned = g(srv, "ls", "-t", "bob", "-q", "default", "--limit", "1")
    assert pinned.stdout.splitlines()[0].strip().endswith(" workload(s) in bob/default"), pinned.stdout
    assert alice


# ---- 9. lite_http: a header value that would not stay one header line

@pytest.mark.parametrize(("token", "said"), [
    ("abc\r\nX-Admin: 1", "a line break"), ("abc\ndef", "a line break"), ("tökén€", "the character U+20AC")])
def test_lite_http_refuses_a_header_it_cannot_send_whole(token: str, said: str) -> None:
    from gpupool.errors import InvalidInput
    from gpupool.lite_http import request

    sentence = f"Cannot send Authorization: it holds {said}, which an HTTP header cannot carry"
    with pytest.raises(InvalidInput, match=re.escape(sentence)):
        request("http://127.0.0.1:9", "GET", "/api/v1/workloads", token)  # refused before any connection


# ---- 10. help that names sub-commands that exist; where a missing profile directory was named

def test_the_fabric_summary_names_its_own_sub_commands() -> None:
    from typer.main import get_command

    from gpupool.cli.fabric import app
    from gpupool.cli.main import SUBCOMMANDS

    summary = SUBCOMMANDS["fabric"][2]
    named = {word.strip(" .,;") for word in summary.split(":", 1)[1].replace(";", ",").split(",")}
    commands = set(get_command(app).commands)  # type: ignore[attr-defined]
    assert named == commands, (named, commands)


def test_a_missing_profile_directory_says_where_it_was_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    env = {**os.environ}
    env.pop("GPUPOOL_PROFILES_DIR", None)
    by_flag = run_cli(["profile", "ls", "--dir", str(missing)], env)
    one_line_error(by_flag, 2, f"Error: {missing}: profile directory does not exist; create it or give --dir "
                   "an existing directory.")
    by_env = run_cli(["profile", "ls"], {**env, "GPUPOOL_PROFILES_DIR": str(missing)})
    one_line_error(by_env, 2, f"Error: {missing}: profile directory does not exist; create it or unset "
                   "GPUPOOL_PROFILES_DIR, which names it.")
