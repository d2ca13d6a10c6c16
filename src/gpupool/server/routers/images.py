"""Image routes: list the pool's images (every token), import and remove them (admin only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from starlette.concurrency import run_in_threadpool

from gpupool.api.common import ErrorBody
from gpupool.api.images import IMAGE_NAME_PATTERN, IMAGE_NAME_RULE, ImageOut
from gpupool.server.deps import Rt, Who
from gpupool.server.images import check_name
from gpupool.server.services import audit, image_use

router = APIRouter(tags=["images"], responses={401: {"model": ErrorBody}})
ImageNameParam = Annotated[str, Path(min_length=1, max_length=63, pattern=IMAGE_NAME_PATTERN)]


@router.get("/images", response_model=list[ImageOut])
def list_images(rt: Rt, who: Who) -> list[ImageOut]:
    """The pool's images: every tenant's pods may run in them (`submit --image NAME`)."""
    return rt.images.all()


@router.post("/images", response_model=ImageOut, status_code=201,
             responses={400: {"model": ErrorBody}, 403: {"model": ErrorBody}, 409: {"model": ErrorBody}})
async def import_image(request: Request, rt: Rt, who: Who,
                       name: Annotated[str, Query(max_length=63, description=IMAGE_NAME_RULE)] = ""
                       ) -> ImageOut:
    """Import the request's body, a tar (or .tar.gz) of a root filesystem or of an OCI image layout,
    as image `name` (replacing one of that name, refused (409) while pending or running work or a
    service uses it). Admin only: every tenant's pods may run in it."""
    who.require_admin()  # before the name is judged: a tenant learns nothing but that it may not
    check_name(name)
    store = rt.images
    if store.get(name) is not None:  # before a byte of the upload is read
        with rt.store.read() as session:
            image_use.refuse_if_used(session, name, replacing=True)
    with store.spool() as spool:
        async for chunk in request.stream():
            await run_in_threadpool(spool.write, chunk)
        spool.seek(0)
        image = await run_in_threadpool(store.import_archive, name, spool)
    with rt.store.write() as session:
        audit.record(session, who, "image.import", name, rt.clock(), image.digest)
    return image


@router.delete("/images/{name}", response_model=ImageOut,
               responses={403: {"model": ErrorBody}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
def remove_image(name: ImageNameParam, rt: Rt, who: Who) -> ImageOut:
    """Forget image `name` (admin only); refused (409, naming them) while pending or running work or
    a service uses it."""
    who.require_admin()
    if rt.images.get(name) is not None:  # an unknown name: the store's 404
        with rt.store.read() as session:
            image_use.refuse_if_used(session, name)
    image = rt.images.remove(name)
    with rt.store.write() as session:
        audit.record(session, who, "image.rm", name, rt.clock(), image.digest)
    return image
