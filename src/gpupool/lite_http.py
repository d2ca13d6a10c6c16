"""A minimal HTTP/1.1 client over a plain socket, for the CLI paths that must start fast.

`http.client` and httpx each cost tens of milliseconds to import; one JSON request to a local
server needs neither. Plain http:// only; the SDK (gpupool.client, httpx) handles the rest.
"""

from __future__ import annotations

try:  # the C module: socket.py itself pulls in enum, selectors and more
    import _socket as socket_impl
except ImportError:  # pragma: no cover - other Python implementations
    import socket as socket_impl  # type: ignore[no-redef]


class NotPlainHttp(Exception):
    """The URL needs TLS or a proxy: use the full client instead."""


def _split(url: str) -> tuple[str, int, str]:
    if not url.startswith("http://") or "," in url:  # several servers: the SDK fails over between them
        raise NotPlainHttp(url)
    rest = url[len("http://"):]
    hostport, _, prefix = rest.partition("/")
    host, _, port = hostport.rpartition(":") if ":" in hostport.strip("[]") else (hostport, "", "80")
    if host.startswith("["):
        host = host[1:-1]
    return host or hostport, int(port or 80), ("/" + prefix).rstrip("/")


def check_header(line: str) -> str:
    """`line` (a request line or `Name: value`) unchanged, or InvalidInput when it would not stay one
    header line: a CR, LF or other control character would end it early and start another (header
    injection), and a character beyond latin-1 cannot be sent in a header at all."""
    bad = next((ch for ch in line if (ch < " " and ch != "\t") or ch == "\x7f" or ch > "\xff"), None)
    if bad is None:
        return line
    from gpupool.errors import InvalidInput

    name = line.split(":", 1)[0] if ":" in line.split(" ", 1)[0] else "the request line"
    what = "a line break" if bad in "\r\n" else f"the character U+{ord(bad):04X}"
    raise InvalidInput(f"Cannot send {name}: it holds {what}, which an HTTP header cannot carry; check the "
                       "server URL and token for stray characters.")


def request(url: str, method: str, path: str, token: str, body: bytes | None = None,
            timeout_s: float = 30.0) -> tuple[int, bytes]:
    """(status, body) of one request; raises Unavailable when the server cannot be reached."""
    host, port, prefix = _split(url)
    head = [f"{method} {prefix}{path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
            "Accept: application/json", "User-Agent: gpupool-cli"]
    if token:
        head.append(f"Authorization: Bearer {token}")
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    for line in head:
        check_header(line)
    payload = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")
    family = socket_impl.AF_INET6 if ":" in host else socket_impl.AF_INET
    sock = socket_impl.socket(family, socket_impl.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect((host, port))
        sock.sendall(payload)
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
    except OSError as exc:
        from gpupool.errors import Unavailable

        raise Unavailable(
            f"Cannot reach the gpupool server at {url} ({exc.strerror or exc}); start it with "
            "`gpupool up` or point GPUPOOL_URL at it."
        ) from None
    finally:
        sock.close()
    return _parse(b"".join(chunks), url)


def _parse(raw: bytes, url: str) -> tuple[int, bytes]:
    header, _, body = raw.partition(b"\r\n\r\n")
    lines = header.split(b"\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        from gpupool.errors import Unavailable

        raise Unavailable(f"The server at {url} did not answer HTTP; check GPUPOOL_URL.") from None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = _dechunk(body)
    return status, body


def _dechunk(body: bytes) -> bytes:
    out = []
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out.append(rest[:size])
        body = rest[size + 2:]
    return b"".join(out)


def _error_classes() -> dict[str, type]:
    from gpupool.errors import GpupoolError

    found: dict[str, type] = {}
    stack: list[type] = [GpupoolError]
    while stack:
        cls = stack.pop()
        found.setdefault(str(getattr(cls, "code", "")), cls)
        stack.extend(cls.__subclasses__())
    return found


def retry_wait(status: int, retry_after: str | float | None) -> float | None:
    """Seconds to wait before sending again a request answered 503 or 429 with a Retry-After of
    `retry_after` seconds (the store unavailable, or the tenant past its request rate: nothing of
    it was done; at most 5), else None (a 429 for max_pending carries none: waiting alone does not
    help). The SDK and the CLI's fast submission both wait by it."""
    if status not in (503, 429) or retry_after is None:
        return None
    try:
        return min(5.0, max(0.1, float(retry_after)))
    except (TypeError, ValueError):
        return None


LARGE_BODY_BYTES = 64 << 10
"""A request body from which a connection the server closes while it is sent is put down to the pool's
request body limit (`gpupool up --max-request-body`): the server answers 413 and closes at once. The
SDK says so (`client._cut_off`); `request` here would only see the connection reset, so the fast
submission path hands bodies past this size to the SDK."""


NO_SUCH_PATH = "No such API path"
"""How a gpupool server's 404 for a path it has no route for begins (server/http_errors.py)."""


def error_from_answer(status: int, body: bytes, url: str = "") -> Exception:
    """The gpupool error an error answer stands for (its `code` picks the class). `url`, the server's
    base URL, is named when the answer suggests it is the wrong one."""
    import json

    from gpupool.errors import Forbidden, GpupoolError, InvalidInput, NotFound, Unauthorized, Unavailable

    at = f" at {url}" if url else ""
    try:
        payload = json.loads(body)
        code, message = str(payload["code"]), str(payload["message"])
        details = payload.get("details") or {}
    except (ValueError, KeyError, TypeError, AttributeError):
        code, details = "", {}
        if status in (502, 503, 504):  # a proxy in front of the pool, whose server is not answering
            message = f"The server{at} answered HTTP {status} without an error body; try again later."
        else:
            message = (f"The server{at} answered HTTP {status} without a gpupool error body: it does not "
                       "look like a gpupool server; check the URL (GPUPOOL_URL).")
    if status == 404 and message.startswith(NO_SUCH_PATH):
        message = (f"No such API path{at}: the URL may be wrong (check GPUPOOL_URL: the server's address, "
                   "with a path only where a proxy serves the pool under one), or the server is older than "
                   "this client.")
    cls = _error_classes().get(code)
    if cls is None:
        by_status = {401: Unauthorized, 403: Forbidden, 404: NotFound, 422: InvalidInput}
        cls = by_status.get(status) or (Unavailable if status in (502, 503, 504) else GpupoolError)
    error = cls(message, **details) if isinstance(details, dict) else cls(message)
    assert isinstance(error, Exception)
    return error
