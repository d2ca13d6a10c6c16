"""What the CLI says about settings and inputs it cannot use: a token or URL no request can carry, a data
directory that is a file, a spec file without end, a spec past the server's request body limit. Each is
one sentence and exit 2, never a traceback; a token is never repeated (it is a secret)."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli_inproc import run_cli
from gpupool.client import Client
from gpupool.errors import TooLarge, Unavailable
from ports import free_port


@pytest.fixture
def env() -> dict[str, str]:
    """A clean environment whose server URL nothing answers."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    return {**base, "GPUPOOL_URL": f"http://127.0.0.1:{free_port()}", "GPUPOOL_TOKEN": "gp_x",
            "COLUMNS": "80"}


def one_sentence(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.stderr, \
        result.stderr
    return lines[0]


# ---- the token ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["ls"], ["submit", "--", "true"]])
def test_a_token_with_a_non_ascii_character_is_refused_with_a_sentence(
        command: list[str], env: dict[str, str]) -> None:
    said = one_sentence(run_cli(command, {**env, "GPUPOOL_TOKEN": "gp_ü"}))
    assert "The token from GPUPOOL_TOKEN has characters a gpupool token never has" in said, said
    assert "ASCII" in said and "gp_ü" not in said


@pytest.mark.parametrize("command", [["ls"], ["submit", "--", "true"]])
def test_a_token_with_a_line_break_is_malformed_and_never_echoed(
        command: list[str], env: dict[str, str]) -> None:
    said = one_sentence(run_cli(command, {**env, "GPUPOOL_TOKEN": "gp_secret\nInjected: 1"}))
    assert said.startswith("Error: The token from GPUPOOL_TOKEN is malformed"), said
    assert "gp_secret" not in said and "Injected" not in said and "Cannot reach" not in said


def test_the_sdk_refuses_a_malformed_token_it_is_given() -> None:
    with pytest.raises(Exception) as refused:
        Client("http://127.0.0.1:1", "gp_\r\nX: y")
    assert getattr(refused.value, "exit_code", None) == 2
    assert str(refused.value).startswith("The token given is malformed") and "gp_" not in str(refused.value)


# ---- the URL --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "why"), [
    ("http://[::1", "its IPv6 address has no closing ]"),
    ("http://[::1]:x", "its port 'x' is not a number from 1 to 65535"),
    ("http://pool:99999", "its port '99999' is not a number from 1 to 65535"),
    ("http://::1:8765", "an IPv6 address must be in brackets"),
    ("http://", "it names no host"),
    ("http://pool .example:80", "it holds a space or a control character"),
    ("localhost:0", "its port '0' is not a number from 1 to 65535"),  # a loopback address, no scheme
])
@pytest.mark.parametrize("command", [["ls"], ["submit", "--", "true"]])
def test_a_url_no_request_can_go_to_is_named_with_the_form_expected(
        url: str, why: str, command: list[str], env: dict[str, str]) -> None:
    said = one_sentence(run_cli(command, {**env, "GPUPOOL_URL": url}))
    assert said == (f"Error: GPUPOOL_URL is {url!r}, which is not a valid URL ({why}); write it as "
                    "http://HOST:PORT or https://HOST:PORT (an IPv6 address in brackets: http://[::1]:8765).")


def test_good_urls_still_pass(env: dict[str, str]) -> None:
    for url in ("http://[::1]:1", "http://127.0.0.1:1/", "https://pool.example/api/v1", "http://h"):
        said = one_sentence(run_cli(["ls"], {**env, "GPUPOOL_URL": url}), code=4)
        assert "Cannot reach the gpupool server" in said, said


# ---- gpupool up -----------------------------------------------------------------------------------------

def test_up_on_a_data_dir_that_is_a_file_says_so(tmp_path: Path, env: dict[str, str]) -> None:
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x\n")
    port = str(free_port())
    said = one_sentence(run_cli(["up", "--data-dir", str(a_file), "--port", port], env))
    assert said == (f"Error: Cannot create the data directory {str(a_file)!r} (it is a file); choose another "
                    "with --data-dir."), said
    below = one_sentence(run_cli(["up", "--data-dir", str(a_file / "pool"), "--port", port], env))
    assert "(a file is in its way)" in below, below


# ---- spec files -----------------------------------------------------------------------------------------

def test_a_spec_file_without_end_is_read_only_to_the_bound(env: dict[str, str]) -> None:
    def bounded() -> None:  # a child that reads without bound fails here, not the machine
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    argv = [sys.executable, "-m", "gpupool.cli.main", "submit", "-f", "/dev/zero"]
    said = one_sentence(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                                       stdin=subprocess.DEVNULL, preexec_fn=bounded))
    assert said == ("Error: Spec file /dev/zero holds more than 16 MiB, far more than a spec needs; put "
                    "large data in a file the pods read and give its path in the spec.")


def test_a_spec_file_that_is_not_utf8_says_where(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "spec.yaml").write_bytes(b"command: [true]\nname: \xff\n")
    said = one_sentence(run_cli(["submit", "-f", "spec.yaml"], env, cwd=tmp_path))
    assert said == ("Error: Cannot read the spec file 'spec.yaml': it is not UTF-8 text (byte 0xff on "
                    "line 2); save it as UTF-8.")


@pytest.fixture
def slammer() -> Iterator[str]:
    """A server that reads a request's head and a little of its body, then resets the connection, as
    gpupool's does once a body passes its limit (it answers 413 and closes while the client still sends)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # so the thread sees `stop` (a closed listener does not wake accept)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            with conn:
                conn.recv(4096)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()
    thread.join(5)


def test_a_spec_past_the_body_limit_is_not_called_an_unreachable_server(
        slammer: str, tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "big.yaml").write_text("command: [true]\nenv:\n  BIG: " + "x" * (3 << 20) + "\n")
    said = one_sentence(run_cli(["submit", "-f", "big.yaml"], {**env, "GPUPOOL_URL": slammer}, cwd=tmp_path))
    assert said == (f"Error: The server at {slammer} closed the connection while the 3.0 MiB request was "
                    "being sent, most likely because it is over the pool's request body limit (gpupool up "
                    "--max-request-body, 1 MiB by default); put large data in a file the pods read, not in "
                    "the request."), said


def cut(request: httpx.Request) -> httpx.Response:
    raise httpx.WriteError("[Errno 104] Connection reset by peer", request=request)


def test_the_sdk_tells_a_large_request_cut_off_from_an_unreachable_server() -> None:
    with Client("http://pool.test", "gp_x", transport=httpx.MockTransport(cut)) as pool:
        with pytest.raises(TooLarge, match=r"closed the connection while the 0\.1 MiB request was being"):
            pool.request("POST", "/workloads", json={"command": ["true"], "env": {"A": "x" * 100_000}})
        with pytest.raises(Unavailable, match="Cannot reach the gpupool server"):  # small: not the limit
            pool.request("POST", "/workloads", json={"command": ["true"]})


def test_the_slammer_stands_for_what_the_fast_path_alone_would_say(slammer: str) -> None:
    """Without the SDK the fast path only sees the reset (why large specs go through the SDK)."""
    from gpupool.lite_http import request

    with pytest.raises(Unavailable, match="Cannot reach"):
        request(slammer, "POST", "/api/v1/workloads", "gp_x", b"{" + b" " * (3 << 20) + b"}")
