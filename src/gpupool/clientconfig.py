"""Where the CLI and the SDK find the server and the token (kept free of heavy imports).

Order: explicit arguments, then GPUPOOL_URL / GPUPOOL_TOKEN, then ~/.config/gpupool/config.toml
(keys `url` and `token`), then, for a server on this machine, the admin-token file that
`gpupool up` wrote in the default data directory.

For an https:// server whose certificate a private CA signed, GPUPOOL_CA_BUNDLE (or the config
file's `ca_bundle` key) names that CA's PEM file; otherwise the system's trusted CAs verify it.
"""

from __future__ import annotations

import os

DEFAULT_URL = "http://127.0.0.1:8765"


def config_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "gpupool", "config.toml")


def _config_file() -> dict[str, object]:
    path = config_path()
    if not os.path.isfile(path):
        return {}
    import tomllib

    from gpupool.errors import InvalidInput

    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidInput(f"Cannot read {path}: {exc}; fix or remove that file.") from None


_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def _all_local(url: str) -> bool:
    """Whether every server `url` names (a comma-separated list for HA) is on this machine, by its
    host name exactly: the admin token is sent to each of them, so `localhost.example.org` or a
    list with one remote server must not get it."""
    import urllib.parse

    try:
        hosts = [urllib.parse.urlsplit(part.strip()).hostname for part in url.split(",") if part.strip()]
    except ValueError:
        return False
    return bool(hosts) and all(host in _LOCAL_HOSTS for host in hosts)


def _local_admin_token(url: str) -> tuple[str, str]:
    """(token, path) of the admin-token file `gpupool up` wrote here, for a server on this machine."""
    if not _all_local(url):
        return "", ""
    import platformdirs

    path = os.path.join(platformdirs.user_data_dir("gpupool", appauthor=False), "admin-token")
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip(), path
    except OSError:
        return "", ""


def resolve(url: str | None = None, token: str | None = None) -> tuple[str, str]:
    """(base URL without a trailing slash or /api/v1, token or '')."""
    url, token, _ = _resolve(url, token)
    return url, token


def token_source() -> str:
    """Where resolve() finds the token (GPUPOOL_TOKEN, or the file it was read from), or ''."""
    return _resolve(None, None)[2]


def with_token_source(message: str) -> str:
    """An authentication error's message naming where the token came from."""
    try:
        source = token_source()
    except Exception:  # a second problem must not hide the first
        source = ""
    if not source:
        if message.startswith("No token given"):  # the server's words are for any HTTP client
            return ("No token given: set GPUPOOL_TOKEN (tokens come from `gpupool token create`), or write "
                    f"token = \"...\" in {config_path()}; on the server's machine, "
                    "GPUPOOL_TOKEN=$(cat DATA_DIR/admin-token) gives the admin token of `gpupool up "
                    "--data-dir DATA_DIR`.")
        return message
    if message.startswith("The token "):
        return f"The token from {source} {message[len('The token '):]}"
    return f"{message.rstrip('.')} (the token came from {source})."


def _resolve(url: str | None, token: str | None) -> tuple[str, str, str]:
    config: dict[str, object] | None = None
    url_source = "the URL given"
    if not url:
        url, url_source = os.environ.get("GPUPOOL_URL", ""), "GPUPOOL_URL"
        if not url:
            config = _config_file()
            url, url_source = str(config.get("url", "")), f"url in {config_path()}"
            url = url or DEFAULT_URL
    # several servers of one pool (gpupool up --ha): "URL1,URL2,...", tried in order by the client
    url = ",".join(normalize_url(one, url_source) for one in url.split(",") if one.strip()) or \
        normalize_url(url, url_source)
    source = ""
    if not token:
        token, source = os.environ.get("GPUPOOL_TOKEN", ""), "GPUPOOL_TOKEN"
        if not token:
            config = _config_file() if config is None else config
            token, source = str(config.get("token", "")), config_path()
            if not token:
                token, source = _local_admin_token(url)
    if token:
        check_token(token, source)
    return url, token, source if token else ""


def check_token(token: str, source: str) -> None:
    """Refuse a token no server ever issued: one with a character outside printable ASCII (a header
    cannot carry it; a line break would even end the header). `source` is where it came from ('': the
    caller gave it). The token itself is never repeated: it is a secret."""
    if all("!" <= ch <= "~" for ch in token):
        return
    from gpupool.errors import InvalidInput

    which = f"The token from {source}" if source else "The token given"
    if not token.isascii():
        raise InvalidInput(f"{which} has characters a gpupool token never has (tokens are "
                           "ASCII letters, digits, '-' and '_'); copy it again from where it was issued "
                           "(gpupool token create).")
    raise InvalidInput(f"{which} is malformed: it holds a space, line break or other control "
                       "character; copy it again without them (gpupool token create issues tokens).")


def normalize_url(url: str, source: str = "the server URL") -> str:
    """The base URL: `/api/v1` and trailing slashes dropped; a loopback address without a scheme
    gets http://; any other URL without http:// or https:// is refused with a sentence."""
    scheme, sep, rest = url.strip().partition("://")
    text = scheme + sep + rest.rstrip("/") if sep else scheme.rstrip("/")  # "http://" keeps its scheme
    if text.endswith("/api/v1"):
        text = text[: -len("/api/v1")]
    if "://" not in text:
        hostport = text.split("/", 1)[0]
        host = hostport[1:hostport.find("]")] if hostport.startswith("[") else hostport.rpartition(":")[0]
        if not ((host or hostport).lower() in ("localhost", "::1") or (host or hostport).startswith("127.")):
            from gpupool.errors import InvalidInput

            raise InvalidInput(f"{source} is {url!r}, which has no scheme; write http://{text} or "
                               f"https://{text}.")
        text = "http://" + text
    if not text.startswith(("http://", "https://")):
        from gpupool.errors import InvalidInput

        raise InvalidInput(f"{source} is {url!r}; give an http:// or https:// URL.")
    problem = _url_problem(text)
    if problem:
        from gpupool.errors import InvalidInput

        raise InvalidInput(f"{source} is {url!r}, which is not a valid URL ({problem}); write it as "
                           "http://HOST:PORT or https://HOST:PORT (an IPv6 address in brackets: "
                           "http://[::1]:8765).")
    return text


def _url_problem(url: str) -> str:
    """What makes the http(s) URL `url` one no request can be sent to, or '' (checked by hand: the
    fast submission path does not import urllib.parse, which imports `re`)."""
    if any(ch <= " " or ch == "\x7f" for ch in url):
        return "it holds a space or a control character"
    rest = url.partition("://")[2]
    for end in "/?#":
        rest = rest.partition(end)[0]
    hostport = rest.rpartition("@")[2]
    if hostport.startswith("["):
        close = hostport.find("]")
        if close < 0:
            return "its IPv6 address has no closing ]"
        host, after = hostport[1:close], hostport[close + 1:]
        if after and not after.startswith(":"):
            return f"{after!r} follows the address where a :PORT belongs"
        port = after[1:]
    elif hostport.count(":") > 1:
        return "an IPv6 address must be in brackets"
    else:
        host, _, port = hostport.partition(":")
    if not host:
        return "it names no host"
    if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        return f"its port {port!r} is not a number from 1 to 65535"
    return ""


def ca_bundle() -> str | None:
    """The PEM file of CAs to trust for https:// (GPUPOOL_CA_BUNDLE, then `ca_bundle` in the config
    file), or None for the system's; raises InvalidInput when the named file cannot be read."""
    path = os.environ.get("GPUPOOL_CA_BUNDLE", "")
    source = "GPUPOOL_CA_BUNDLE"
    if not path:
        path = str(_config_file().get("ca_bundle", ""))
        source = f"ca_bundle in {config_path()}"
    if not path:
        return None
    if not os.access(path, os.R_OK) or not os.path.isfile(path):
        from gpupool.errors import InvalidInput

        raise InvalidInput(f"{source} names {path!r}, which is not a readable file; point it at the "
                           "PEM certificate of the CA that signed the server's certificate.")
    return path
