"""`gpupool submit` without typer, pydantic or httpx: parse flags, POST the spec, print the id.

The spec carries the directory submit ran in (`submit_dir`): without --workdir the pods run there
when their node has it and their account may enter it (agent/workdir.py), else in their private one.

This is the path people run in loops, so on success it imports nothing beyond the C socket
module (the server validates the spec; even `json` and `typing` are left out because they pull in
`re`). `gpupool submit --help` goes through typer (cli/submit.py).
"""

from __future__ import annotations

import sys
import time

from gpupool.durations import duration_s

USAGE = (
    "usage: gpupool submit [--name N] [--tenant T] [--queue Q] [--priority P] [--priority-class C] "
    "[--gpus 0.25|2] [--gpu-memory 8GiB] [--cpu 4] [--memory 16GiB] [--replicas N] [--env K=V] "
    "[--workdir D] [--time-limit 2h] [--checkpoint-every 30m] [--max-retries N] [--array 0-99%10] "
    "[--topology required=leaf] [--separate-stderr] [--dependency afterok:ID] "
    "[--kill-on-invalid-dep no] [--launcher torchrun] [--image NAME] [--mount SRC:DST[:ro]] "
    "[--secret NAME[:ENV_VAR|:/run/secrets/F]] [--constraint KEY[=VALUE]] "
    "[-f spec.yaml] -- COMMAND..."
)
# flag -> (path in the spec, kind)
_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "--name": (("name",), "str"), "-n": (("name",), "str"),
    "--tenant": (("tenant",), "str"), "-t": (("tenant",), "str"),
    "--queue": (("queue",), "str"), "-q": (("queue",), "str"),
    "--priority": (("priority",), "int"), "-p": (("priority",), "int"),
    "--priority-class": (("priority_class",), "str"),
    "--time-limit": (("time_limit_s",), "duration"),
    "--checkpoint-every": (("checkpoint_interval_s",), "duration"),
    "--max-retries": (("max_retries",), "int"),
    "--array": (("array",), "str"), "-a": (("array",), "str"),
    "--gpus": (("resources", "gpus"), "float"), "-g": (("resources", "gpus"), "float"),
    "--gpu-memory": (("resources", "gpu_memory"), "str"),
    "--cpu": (("resources", "cpu"), "str"),
    "--memory": (("resources", "memory"), "str"), "-m": (("resources", "memory"), "str"),
    "--replicas": (("replicas",), "int"), "-r": (("replicas",), "int"),
    "--model": (("resources", "models"), "list"),
    "--env": (("env",), "env"), "-e": (("env",), "env"),
    "--workdir": (("workdir",), "str"), "-w": (("workdir",), "str"),
    "--file": (("",), "file"), "-f": (("",), "file"),
    "--separate-stderr": (("separate_stderr",), "flag"),
    "--topology": (("topology",), "topology"),
    "--dependency": (("dependency",), "dependency"), "-d": (("dependency",), "dependency"),
    "--kill-on-invalid-dep": (("kill_on_invalid_dep",), "yesno"),
    "--image": (("image",), "str"),
    "--mount": (("mounts",), "mount"), "--secret": (("secrets",), "secret"),
    "--launcher": (("launcher",), "launcher"),
    "--constraint": (("constraints",), "constraint"), "-C": (("constraints",), "constraint"),
}
LAUNCHERS = ("none", "torchrun")


# flag -> (lowest, highest, in words): checked here so the error names the flag, not the API field
_RANGES: dict[str, tuple[float, float, str]] = {
    "--time-limit": (1, 366 * 86400, "from 1s to 366d"),
    "--checkpoint-every": (1, 366 * 86400, "from 1s to 366d"),
    "--max-retries": (0, 1000, "from 0 to 1000"),
}


class UsageError(Exception):
    pass


def parse(args: list[str], given: dict[str, str] | None = None) -> dict[str, object]:
    """The workload spec the flags describe (a -f file first, flags on top). `given`, when passed,
    gets each field a flag set, as the server names it ("resources.cpu"), with the flag as typed."""
    flags: dict[tuple[str, ...], object] = {}
    spec: dict[str, object] = {}
    from_file = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            spec["command"] = args[i + 1:] if arg == "--" else args[i:]
            if given is not None:  # the server's "Field 'command' ..." is said of what the user typed
                given["command"] = "the command after --" if arg == "--" else "the command"
            break
        name, eq, inline = arg.partition("=")
        if name not in _FLAGS:
            raise UsageError(_unknown_option(name))
        if _FLAGS[name][1] == "flag":
            if eq:
                raise UsageError(f"Option {name} takes no value.")
            flags[_FLAGS[name][0]] = True
            i += 1
            continue
        if eq:
            value = inline
        elif i + 1 < len(args):
            i += 1
            value = args[i]
        else:
            raise UsageError(f"Option {name} needs a value.")
        path, kind = _FLAGS[name]
        if kind == "file":
            from_file = True
            spec = {**_read_file(value), **({"command": spec["command"]} if "command" in spec else {})}
        else:
            _set(flags, path, kind, value, name)
            if given is not None:
                given[".".join(path)] = name
        i += 1
    for path, flag_value in flags.items():
        target = spec
        for key in path[:-1]:
            inner = target.setdefault(key, {})
            if not isinstance(inner, dict):
                raise UsageError(f"The spec file's {key!r} must be a mapping.")
            target = inner
        target[path[-1]] = flag_value
    if not spec.get("command") and not from_file:  # with a file, the server lists all its problems at once
        raise UsageError("Give the command to run after `--`, e.g. gpupool submit --gpus 1 -- python app.py.")
    if "submit_dir" not in spec:
        here = _cwd()
        if here:
            spec["submit_dir"] = here  # without --workdir, pods run here when their node lets them
    return spec


def _cwd() -> str:
    """The directory submit runs in ('' when it was deleted meanwhile)."""
    import os  # already loaded by the interpreter: costs a dict lookup

    try:
        return os.getcwd()
    except OSError:
        return ""


def _unknown_option(name: str) -> str:
    from gpupool.errors import closest

    close = closest(name, [flag for flag in _FLAGS if flag.startswith("--")])
    hint = f"did you mean {close}?" if close else "see gpupool submit --help."
    return f"gpupool submit has no option {name}; {hint}"


def _set(flags: dict[tuple[str, ...], object], path: tuple[str, ...], kind: str, value: str,
         name: str) -> None:
    try:
        if kind == "int":
            flags[path] = int(value)
        elif kind == "float":
            number = float(value)
            if number != number:
                raise ValueError
            if number in (float("inf"), float("-inf")):
                raise UsageError(f"Option {name} got {value!r}, which is too large; write a realistic amount "
                                 "(a fraction such as 0.25 or a count such as 2).")
            flags[path] = number
        elif kind == "duration":
            flags[path] = duration_s(value)
        elif kind == "dependency":
            from gpupool.api.dependency_spec import parse_dependency

            try:
                parse_dependency(value)
            except ValueError as exc:
                raise UsageError(f"Option {name} {exc}.") from None
            flags[path] = value
        elif kind == "yesno":
            if value.lower() not in ("yes", "no"):
                raise ValueError
            flags[path] = value.lower() == "yes"
        elif kind == "list":
            items = flags.setdefault(path, [])
            assert isinstance(items, list)
            items.append(value)
        elif kind == "env":
            key, sep, val = value.partition("=")
            if not sep or not key:
                raise ValueError
            env = flags.setdefault(path, {})
            assert isinstance(env, dict)
            env[key] = val
        elif kind == "constraint":
            from gpupool.api.workloads import CONSTRAINT_RE, CONSTRAINT_RULE

            if not CONSTRAINT_RE.fullmatch(value):
                raise UsageError(f"Option {name} got {value!r}, which {CONSTRAINT_RULE}.")
            flags.setdefault(path, [])
            flags[path].append(value)  # type: ignore[attr-defined]
        elif kind == "topology":
            flags[path] = _topology(value, name)
        elif kind in ("mount", "secret"):
            flags.setdefault(path, [])
            flags[path].append(_mount_or_secret(kind, value))  # type: ignore[attr-defined]
        elif kind == "launcher":
            if value not in LAUNCHERS:
                from gpupool.errors import did_you_mean

                raise UsageError(f"Option {name} takes {' or '.join(LAUNCHERS)}, got {value!r}."
                                 f"{did_you_mean(value, list(LAUNCHERS))}")
            flags[path] = value
        else:
            flags[path] = value
        bounds = _RANGES.get(name)
        if bounds is not None and not bounds[0] <= flags[path] <= bounds[1]:  # type: ignore[operator]
            raise UsageError(f"Option {name} takes {bounds[2]}, got {value!r}.")
    except ValueError:
        wanted = {"int": "a whole number", "float": "a number such as 0.25 or 2", "env": "KEY=VALUE",
                  "yesno": "yes or no",
                  "duration": "a duration such as 90s, 30m, 2h, 1d, 1:30:00 or 2-12:00:00 (days-hours)"}
        raise UsageError(f"Option {name} takes {wanted.get(kind, 'a value')}, got {value!r}.") from None


def _topology(value: str, name: str) -> str:
    """`value` when it reads as a topology; else the parser's sentence, said of the option (as the
    other options' errors are), not of the request's field."""
    from gpupool.core.topology_spec import parse_topology_spec
    from gpupool.errors import InvalidInput

    try:
        parse_topology_spec(value)
    except InvalidInput as exc:
        raise UsageError(f"Option {name} got {value!r}: {exc.message[:1].lower()}{exc.message[1:]}") from None
    return value


def _mount_or_secret(kind: str, value: str) -> dict[str, object]:
    """`--mount SRC:DST[:ro]` or `--secret NAME[:TARGET]` as the spec's entry; UsageError otherwise."""
    from gpupool.api.mounts import parse_mount, parse_secret_use
    from gpupool.errors import InvalidInput

    try:
        parsed = parse_mount(value) if kind == "mount" else parse_secret_use(value)
    except InvalidInput as exc:
        raise UsageError(exc.message) from None
    return parsed.model_dump(exclude_defaults=True)


MAX_SPEC_FILE_BYTES = 16 << 20
"""The most a spec file (-f) may hold: far more than any spec needs (the server takes 1 MiB requests by
default), and a bound on what is read from a device or a pipe named by mistake (-f /dev/zero)."""


def _read_file(path: str) -> dict[str, object]:
    import yaml

    from gpupool.errors import InvalidInput
    from gpupool.yamlfiles import read_text, safe_load

    try:
        data = safe_load(read_text(path, "the spec file", bound=(
            MAX_SPEC_FILE_BYTES, f"Spec file {path} holds more than {MAX_SPEC_FILE_BYTES >> 20} MiB, far "
            "more than a spec needs; put large data in a file the pods read and give its path in the spec.")))
    except InvalidInput as exc:
        raise UsageError(exc.message) from None
    except OSError as exc:
        raise UsageError(f"Cannot read spec file {path}: {exc.strerror}.") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"Spec file {path} is not valid YAML{yaml_problem(exc)}.") from None
    if not isinstance(data, dict):
        raise UsageError(f"Spec file {path} must hold a mapping (command:, resources:, ...).")
    return data


def yaml_problem(exc: Exception) -> str:
    """PyYAML's several-line error as the end of one sentence: " at line 2, column 7: expected the
    node content, but found ']' (while parsing a flow node)"."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = " ".join(str(getattr(exc, "problem", None) or "").split())
    context = " ".join(str(getattr(exc, "context", None) or "").split())
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if not problem:
        return where + (f": {' '.join(str(exc).split())}" if not where else "")
    return f"{where}: {problem}" + (f" ({context})" if context else "")


def run(args: list[str]) -> int:
    """Submit and print the workload id; returns the exit code."""
    given: dict[str, str] = {}
    try:
        print(submit(parse(args, given)))
    except UsageError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        code = getattr(exc, "exit_code", None)  # a GpupoolError, without importing it up front
        if code is None:
            raise
        message = str(getattr(exc, "message", exc))
        if getattr(exc, "code", "") == "unauthorized":
            from gpupool.clientconfig import with_token_source

            message = with_token_source(message)
        print(f"Error: {in_flag_terms(message, given)}", file=sys.stderr)
        return int(code)
    return 0


def in_flag_terms(message: str, given: dict[str, str]) -> str:
    """The server's sentence about a spec's fields ("Field 'resources.cpu' must ..."), each field a
    flag set named as that flag ("--cpu must ..."): the user typed the flag, not the field."""
    if "ield '" not in message or not given:
        return message
    import re

    def named(match: re.Match[str]) -> str:
        flag = given.get(match.group(2))
        return f"{flag} " if flag else match.group(0)

    return re.sub(r"\b([Ff]ield) '([^']+)' ", named, message)


def submit(spec: dict[str, object], url: str | None = None, token: str | None = None) -> str:
    """POST the spec; returns the new workload id or raises the matching gpupool error."""
    from gpupool.clientconfig import resolve
    from gpupool.lite_http import LARGE_BODY_BYTES, NotPlainHttp, error_from_answer, request

    url, token = resolve(url, token)
    payload = to_json(spec).encode()
    deadline = time.monotonic() + RATE_RETRY_S
    while True:
        try:
            if len(payload) > LARGE_BODY_BYTES:  # the SDK says why a server cut it off (past its limit)
                raise NotPlainHttp(url)
            status, body = request(url, "POST", "/api/v1/workloads", token, payload)
        except NotPlainHttp:
            from gpupool.client import Client

            with Client(url, token) as client:
                return client.submit(spec)
        wait = _rate_wait(status, body)
        if wait is None or time.monotonic() + wait > deadline:
            break
        time.sleep(wait)  # the tenant was past its request rate and nothing was stored: send it again
    if status != 201:
        raise error_from_answer(status, body, url)
    return created_id(body)


RATE_RETRY_S = 30.0
"""How long a submission refused for the tenant's request rate is sent again (as the client does)."""


def _rate_wait(status: int, body: bytes) -> float | None:
    """Seconds to wait before sending again a submission the server refused for the tenant's request
    rate (429 too_many_requests; `lite_http.retry_wait`, its Retry-After given in the body too),
    else None."""
    if status != 429 or b'"too_many_requests"' not in body:
        return None
    import json

    from gpupool.lite_http import retry_wait

    try:
        seconds = float(json.loads(body)["details"]["retry_after_s"])
    except (ValueError, KeyError, TypeError):
        seconds = 1.0
    return retry_wait(status, seconds)


def created_id(body: bytes) -> str:
    """The "id" of a `201 Created` answer (ids are plain ASCII: letters, digits and '-')."""
    marker = b'"id":"'
    start = body.find(marker)
    end = body.find(b'"', start + len(marker))
    if start < 0 or end < 0:
        import json

        return str(json.loads(body)["id"])
    return body[start + len(marker):end].decode()


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def to_json(value: object) -> str:
    """JSON for the spec's plain values (str, int, float, bool, None, list, dict)."""
    if isinstance(value, str):
        out = []
        for ch in value:
            if ch in _ESCAPES:
                out.append(_ESCAPES[ch])
            elif ch < " ":
                out.append(f"\\u{ord(ch):04x}")
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int | float):
        if value != value or value in (float("inf"), float("-inf")):
            raise UsageError(f"{value} is not a number the server can read.")
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{to_json(str(k))}:{to_json(v)}" for k, v in value.items()) + "}"
    raise UsageError(f"Cannot send {value!r} in a spec; use strings, numbers, lists and mappings.")
