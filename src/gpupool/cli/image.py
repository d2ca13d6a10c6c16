"""`gpupool image import|ls|rm`: the pool's container images, which `submit --image NAME` runs pods in."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gpupool.cli._common import client, reports_errors
from gpupool.cli.output import Column, Format, OutputOption

app = typer.Typer(help="Container images: import (admin), ls, rm (admin).\n\n"
                  "Example: gpupool image import rootfs.tar tiny", no_args_is_help=True)


@app.command("import")
@reports_errors
def import_image(
    archive: Annotated[Path, typer.Argument(help=(
        "A tar (or .tar.gz) of a root filesystem (tar -C ROOTFS -cf FILE.tar .), or of an OCI image "
        "layout (skopeo copy ... oci-archive:FILE.tar, podman save --format oci-archive)."))],
    name: Annotated[str, typer.Argument(help="Its name: lower-case letters, digits, '.', '_', '-'.")],
) -> None:
    """Import an image into the pool's store (admin; replaces an image of that name, refused while
    pending or running work or a service uses it). Members with absolute names, '..' or paths through
    links refuse the archive; device nodes and set-uid bits are left out (listed). No registry is
    needed: build the archive anywhere and bring the file.

    Example: gpupool image import debian-rootfs.tar debian
    """
    if not archive.is_file():
        raise typer.BadParameter(f"{str(archive)!r} is not a file; give the path of a .tar archive.")
    with client() as pool:
        image = pool.import_image(archive, name)
    print(f"imported {image.name} ({image.digest[:19]}, {image.files} entries, {_size(image.size_bytes)})")
    for line in image.skipped:
        print(f"  changed: {line}")


@app.command("ls")
@reports_errors
def list_images(output: OutputOption = Format.TABLE) -> None:
    """List the pool's images (every tenant's pods may run in them).

    Example: gpupool image ls -o name
    """
    from gpupool.cli._common import ago
    from gpupool.cli.output import render

    with client() as pool:
        images = pool.images()
    now = time.time()
    columns: list[Column[Any]] = [
        Column("NAME", lambda i: i.name, key=True),
        Column("DIGEST", lambda i: i.digest[:19]),
        Column("SOURCE", lambda i: i.source, squeeze=True),
        Column("SIZE", lambda i: _size(i.size_bytes)),
        Column("FILES", lambda i: str(i.files)),
        Column("CREATED", lambda i: ago(i.created_s, now)),
    ]
    render(output, images, columns, key=lambda i: i.name, title=f"{len(images)} image(s)")


@app.command("rm")
@reports_errors
def remove_image(
    name: Annotated[str, typer.Argument(help="The image to remove.")],
) -> None:
    """Remove an image (admin). Refused (exit 2, naming them) while pending or running work or a
    service uses it: wait for that work or cancel it, and delete the service or change its image.

    Example: gpupool image rm tiny
    """
    with client() as pool:
        image = pool.remove_image(name)
    print(f"removed {image.name} ({image.digest[:19]})")


def _size(size_bytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.1f} {unit}"
    return f"{size_bytes} B"


@app.callback()
def _group() -> None:
    """Container images: import (admin), ls, rm (admin)."""
