"""`gpupool secret create|ls|delete`: a tenant's secrets, given to its pods with `submit --secret`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpupool.api.secrets import MAX_SECRET_BYTES
from gpupool.cli._common import client, reports_errors
from gpupool.cli.output import Column, Format, OutputOption

app = typer.Typer(help="A tenant's secrets: create, ls, delete (values are never shown).\n\n"
                  "Example: gpupool secret create hf --from-literal HF_TOKEN=hf_xxx", no_args_is_help=True)
TenantOption = Annotated[str | None, typer.Option("--tenant", "-t", help="Admin only: the tenant's.")]


def _read_upto(path: str, room: int) -> bytes:
    """The bytes of `path`, reading at most `room` + 1 of them: a file past the secrets' limit (or one
    that never ends, as /dev/zero) is refused once it has given more than `room`, never read whole."""
    try:
        with open(path, "rb") as handle:
            value = handle.read(room + 1)
    except OSError as exc:
        raise typer.BadParameter(f"Cannot read {path}: {exc.strerror}.") from None
    if len(value) > room:
        raise typer.BadParameter(
            f"{path} takes the secret past {MAX_SECRET_BYTES:,} bytes ({MAX_SECRET_BYTES // 1024} KiB), the "
            "most a secret's values hold together (it is for credentials and small key files); keep large "
            "files on a mount instead.")
    return value


def _data(from_file: list[str], from_literal: list[str]) -> dict[str, bytes]:
    data: dict[str, bytes] = {}

    def put(key: str, value: bytes, flag: str) -> None:
        if key in data:
            raise typer.BadParameter(f"Key {key!r} is given twice ({flag}); give each key once.")
        data[key] = value

    for item in from_literal:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter("--from-literal takes KEY=VALUE (what was given is not repeated here: "
                                     "it may be the secret).")
        put(key, value.encode(), "--from-literal")
    for item in from_file:
        key, sep, path = item.partition("=")
        if not sep:
            key, path = Path(item).name, item
        room = max(MAX_SECRET_BYTES - sum(len(value) for value in data.values()), 0)
        put(key, _read_upto(path, room), "--from-file")
    if not data:
        raise typer.BadParameter("Give the value with --from-literal KEY=VALUE or --from-file [KEY=]FILE "
                                 "(repeatable).")
    return data


@app.command()
@reports_errors
def create(
    name: Annotated[str, typer.Argument(help="Its name: lower-case letters, digits and '-'.")],
    from_file: Annotated[list[str] | None, typer.Option(
        "--from-file", help="[KEY=]FILE: a key holding the file's bytes (KEY defaults to the file's "
        f"name); repeatable. A secret's values hold at most {MAX_SECRET_BYTES // 1024} KiB together.")
    ] = None,
    from_literal: Annotated[list[str] | None, typer.Option(
        "--from-literal", help="KEY=VALUE: a key holding the text (prefer --from-file: a command line "
        "is seen by other users of this machine and kept in shell history); repeatable.")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="Replace a secret of that name.")] = False,
    tenant: TenantOption = None,
) -> None:
    """Store a secret, sealed at rest with the pool's key; prints its name and keys, never a value.
    Only the tenant's own token creates or replaces one (its keys become variables of the tenant's
    pods): the admin's is refused, and lists and deletes.

    Example: gpupool secret create db --from-file password=./db-password --from-literal user=app

    Exit codes: 0 stored, 2 bad usage or the name is taken (use --replace), 3 tenant not found.
    """
    data = _data(from_file or [], from_literal or [])
    with client() as pool:
        out = pool.create_secret(name, data, tenant=tenant, replace=replace)
    print(f"{out.name} ({', '.join(out.keys)})")


@app.command("ls")
@reports_errors
def list_secrets(tenant: TenantOption = None, output: OutputOption = Format.TABLE) -> None:
    """List secrets: names, keys and times (a tenant its own; the admin every tenant's).

    Example: gpupool secret ls -o name
    """
    from gpupool.cli._durations import day
    from gpupool.cli.output import render

    with client() as pool:
        found = pool.secrets(tenant.strip().lower() if tenant else None)
    columns: list[Column[Any]] = [
        Column("NAME", lambda s: s.name, key=True),
        Column("TENANT", lambda s: s.tenant, squeeze=True),
        Column("KEYS", lambda s: ",".join(s.keys), squeeze=True),
        Column("CREATED", lambda s: day(s.created_s)),
        Column("UPDATED", lambda s: day(s.updated_s)),
    ]
    render(output, found, columns, key=lambda s: f"{s.tenant}/{s.name}", title=f"{len(found)} secret(s)")


@app.command()
@reports_errors
def delete(name: Annotated[str, typer.Argument(help="The secret's name.")],
           tenant: TenantOption = None) -> None:
    """Delete a secret; pods already running keep what they were given, later launches that name it fail.

    Example: gpupool secret delete db

    Exit codes: 0 deleted, 3 no such secret.
    """
    with client() as pool:
        out = pool.delete_secret(name, tenant)
    print(f"deleted {out.name}")


@app.callback()
def _group() -> None:
    """A tenant's secrets: create, ls, delete (values are never shown)."""
