"""Replicas for the data plane's tests: small HTTP servers on loopback that say who answered."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx


class Replica:
    """A threaded HTTP server (on `port`, else a free one): GET /ready answers 200 while `ready` is
    set, anything else echoes the replica's name, the path it was asked for and the Authorization
    header it received; a request for /slow waits until `release` is set."""

    def __init__(self, name: str, port: int = 0) -> None:
        self.name = name
        self.ready = threading.Event()
        self.ready.set()
        self.release = threading.Event()
        self.release.set()
        self.seen: list[str] = []
        replica = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                if self.path == "/ready":
                    code, body = (200, b"ok") if replica.ready.is_set() else (503, b"not ready")
                else:
                    replica.seen.append(self.path)
                    if self.path == "/slow":
                        replica.release.wait(30)
                    auth = self.headers.get("Authorization", "-")
                    code, body = 200, f"{replica.name} {self.path} {auth}".encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                pass  # health checks close their connections without a request

        self.server = Server(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def replicas(*names: str) -> Iterator[list[Replica]]:
    made = [Replica(n) for n in names]
    try:
        yield made
    finally:
        for r in made:
            r.close()


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def get(port: int, path: str, token: str | None = None, timeout_s: float = 10.0) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", headers=bearer(token) if token else {},
                     timeout=timeout_s)
