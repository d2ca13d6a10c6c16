"""The typed HTTP SDK for gpupool (httpx): what the CLI uses, and what users may script against.

    from gpupool.client import Client
    with Client() as pool:                      # GPUPOOL_URL / GPUPOOL_TOKEN or the config file
        wid = pool.submit(command=["python", "train.py"], gpus=0.25, gpu_memory="8GiB", time_limit="2h")
        print(pool.wait(wid).status)

`submit` also takes the spec as a mapping ({"command": [...], "resources": {"gpus": 0.25}}) or a
WorkloadSpec, with keyword arguments on top.

Errors come back as the gpupool error they stand for (NotFound, Forbidden, QuotaExceeded...),
and an unreachable server as Unavailable. https:// servers are verified against the system's CAs,
or against the private CA that GPUPOOL_CA_BUNDLE (or `ca_bundle` in the config file) names.
"""

from __future__ import annotations

import base64
import functools
import os
import ssl
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import IO, Any, TypedDict, TypeVar, Unpack

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from gpupool.api.audit import AuditOut
from gpupool.api.common import Health
from gpupool.api.fabric import FabricOut, LinkChangeOut
from gpupool.api.images import ImageOut
from gpupool.api.mounts import parse_mount, parse_secret_use
from gpupool.api.nodes import NodeOut, PoolSummary
from gpupool.api.secrets import SecretDeleted, SecretOut
from gpupool.api.servers import ServersOut
from gpupool.api.services import PartnersOut, ServiceOut, ServiceSpec, ServiceStreamEvent
from gpupool.api.session import WhoAmI
from gpupool.api.tenants import QueueOut, TenantDeleted, TenantOut, TokenInfo, TokenOut
from gpupool.api.usage import UsageOut
from gpupool.api.workloads import (
    ArrayCancelled,
    EventOut,
    LogsOut,
    ResourcesSpec,
    WorkloadOut,
    WorkloadPage,
    WorkloadSpec,
)
from gpupool.clientconfig import ca_bundle, resolve
from gpupool.durations import duration_s
from gpupool.errors import InvalidInput, TooLarge, Unavailable, closest
from gpupool.lite_http import LARGE_BODY_BYTES, error_from_answer, retry_wait

M = TypeVar("M", bound=BaseModel)
API = "/api/v1"
ID_PAGE = 10_000
"""Ids per page of workload_ids() (the server's most with fields=id)."""
_UNFINISHED = ("pending", "admitted", "running")


class Keep:
    """The type of KEEP: a setting left as it is (None would clear it)."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP = Keep()


class SubmitFields(TypedDict, total=False):
    """The keyword arguments of Client.submit: the fields of WorkloadSpec, with its resources
    (gpus, gpu_memory, cpu, memory, models) given directly, and `time_limit` and `checkpoint_every`
    as durations."""

    command: Sequence[str]
    name: str
    tenant: str
    queue: str
    priority: int
    priority_class: str
    replicas: int
    gpus: float
    gpu_memory: str | int
    cpu: str | float
    memory: str | int
    models: Sequence[str]
    resources: Mapping[str, Any]
    env: Mapping[str, str]
    workdir: str
    separate_stderr: bool
    submit_dir: str
    runtime_estimate_s: float
    time_limit: str | float | timedelta
    time_limit_s: float
    checkpoint_every: str | float | timedelta
    checkpoint_interval_s: float
    max_retries: int
    array: str
    topology: str
    dependency: str
    kill_on_invalid_dep: bool
    image: str
    mounts: Sequence[str | Mapping[str, Any]]
    """"SRC:DST[:ro]" as `submit --mount` takes, or {"source", "target", "read_only"}."""
    secrets: Sequence[str | Mapping[str, Any]]
    """"NAME[:ENV_VAR | :/run/secrets/FILE]" as `submit --secret` takes, or {"name", "env", "path"}."""
    launcher: str
    """'none' or 'torchrun' (`submit --launcher`)."""
    constraints: Sequence[str]
    """Node labels the pods need, "KEY" or "KEY=VALUE", as `submit --constraint` takes."""


class Client:
    """A connection to one gpupool server; safe to reuse for many calls, close it when done."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout_s: float = 30.0,
                 transport: httpx.BaseTransport | None = None, retry_unavailable_s: float = 30.0) -> None:
        urls, self.token = resolve(url, token)
        self.urls = urls.split(",")
        """The pool's servers (GPUPOOL_URL may list several, comma-separated): a request that cannot
        connect to one is sent to the next, in order, and the one that answered is used from then on."""
        self.url = self.urls[0]
        self.retry_unavailable_s = retry_unavailable_s
        """How long a request answered 503 or 429 with Retry-After (the store restarting, or the
        tenant past its request rate; nothing of the request was kept) is sent again before its
        error is raised; 0: never."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            self._http = httpx.Client(base_url=self.url + API, headers=headers, timeout=timeout_s,
                                      transport=transport, verify=_verify(self.url))
        except httpx.InvalidURL as exc:  # what clientconfig's own check lets through
            raise InvalidInput(f"The server URL {self.url!r} is not a valid URL ({exc}); write it as "
                               "http://HOST:PORT or https://HOST:PORT.") from None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ----------------------------------------------------------------- plumbing

    def _call(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None
              ) -> Any:
        deadline = time.monotonic() + self.retry_unavailable_s
        while True:
            answer = self._send(method, path, json, params)
            wait = _retry_after(answer)
            if wait is None or time.monotonic() + wait > deadline:
                break
            time.sleep(wait)  # the store was unavailable and nothing was kept: the same request again
        if answer.status_code >= 400:
            raise error_from_answer(answer.status_code, answer.content, self.url)
        try:
            return answer.json()
        except ValueError:  # a web page (the dashboard's address, another service's port)
            raise _not_a_pool(self.url, answer) from None

    def _send(self, method: str, path: str, json: Any, params: Mapping[str, Any] | None) -> httpx.Response:
        """One request to the server last used, else to the others in order where a connection
        cannot be made (nothing was sent: safe for a submission too); the one that answers is kept."""
        order = [self.url, *(u for u in self.urls if u != self.url)]
        for i, url in enumerate(order):
            if url != self.url:
                self.url = url
                self._http.base_url = httpx.URL(url + API)
            try:
                return self._http.request(method, path, json=json, params=params)
            except ValueError as exc:  # JSON carries no inf or nan (httpx refuses to encode one)
                if "JSON compliant" not in str(exc):
                    raise
                raise InvalidInput("A number in this request is not finite (inf or nan), which JSON cannot "
                                   "carry; give a finite value.") from None
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if i == len(order) - 1:
                    raise _unreachable(", ".join(order) if len(order) > 1 else url, exc) from None
            except httpx.TransportError as exc:
                raise _cut_off(url, exc) or _unreachable(url, exc) from None
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def request(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None
                ) -> Any:
        """Any API route, relative to /api/v1 (`pool.request("GET", "/pool")`): the decoded JSON answer,
        or the project's error for a 4xx/5xx answer. For routes this class has no method for yet."""
        return self._call(method, path, json=json, params=params)

    def _one(self, model: type[M], method: str, path: str, **kwargs: Any) -> M:
        answer = self._call(method, path, **kwargs)
        try:
            return model.model_validate(answer)
        except ValidationError:
            raise _unknown_shape(self.url, model.__name__) from None

    def _many(self, model: type[M], method: str, path: str, **kwargs: Any) -> list[M]:
        answer = self._call(method, path, **kwargs)
        try:
            return TypeAdapter(list[model]).validate_python(answer)  # type: ignore[valid-type]
        except ValidationError:
            raise _unknown_shape(self.url, f"a list of {model.__name__}") from None

    # ----------------------------------------------------------------- workloads

    def health(self) -> Health:
        return self._one(Health, "GET", "/health")

    def submit(self, spec: WorkloadSpec | Mapping[str, Any] | None = None, **fields: Unpack[SubmitFields]
               ) -> str:
        """Submit a workload; returns its id.

            pool.submit(command=["python", "train.py"], gpus=0.25, gpu_memory="8GiB", time_limit="2h")

        Keywords are WorkloadSpec's fields, its resources' fields (gpus, gpu_memory, cpu, memory,
        models), `time_limit` and `checkpoint_every` (seconds, a timedelta, or 90s, 30m, 2h, 1d,
        1:30:00 as in `gpupool submit --time-limit` / `--checkpoint-every`); with `spec` (a mapping
        or a WorkloadSpec) they apply on top of it. An
        unknown keyword raises InvalidInput naming the closest one. With `array` ("0-99%10", Slurm's
        --array) it creates one task per index in one request and returns the array's id (tasks:
        ID_INDEX)."""
        return str(self._call("POST", "/workloads", json=spec_body(spec, dict(fields)))["id"])

    def workloads(self, *, status: Sequence[str] = (), tenant: str | Sequence[str] | None = None,
                  queue: str | Sequence[str] | None = None, limit: int = 100, offset: int = 0,
                  id_prefix: str | None = None, name: str | None = None,
                  since_s: float | None = None, array_id: str | Sequence[str] | None = None,
                  workload_id: str | Sequence[str] | None = None, full: bool = False) -> WorkloadPage:
        """Newest first (at most 1000 a page); filters take any case and comma lists ("a,b"); an
        unknown tenant or queue raises NotFound. `id_prefix` keeps ids starting with it, `name` one
        exact name, `since_s` those submitted at or after it, `array_id` the tasks of those arrays
        (in index order; with `workload_id`, those workloads too). Items are summaries (what each
        asks for in `request`, no command or environment) unless `full`: then whole workloads."""
        params = _list_params(status, tenant, queue, since_s, array_id, workload_id)
        params.update(limit=limit, offset=offset)
        if full:
            params["full"] = "true"
        if id_prefix:
            params["id_prefix"] = id_prefix
        if name is not None:
            params["name"] = name
        return self._one(WorkloadPage, "GET", "/workloads", params=params)

    def workload_ids(self, *, status: Sequence[str] = (), tenant: str | Sequence[str] | None = None,
                     queue: str | Sequence[str] | None = None, since_s: float | None = None,
                     limit: int | None = None, array_id: str | Sequence[str] | None = None,
                     workload_id: str | Sequence[str] | None = None) -> list[str]:
        """The ids of the matching workloads, newest first (an array's tasks: in index order; all of
        them, or the first `limit`), read in pages of up to 10,000 ids."""
        params = _list_params(status, tenant, queue, since_s, array_id, workload_id)
        ids: list[str] = []
        while limit is None or len(ids) < limit:
            page_size = ID_PAGE if limit is None else min(ID_PAGE, limit - len(ids))
            page = self._call("GET", "/workloads", params={**params, "fields": "id", "limit": page_size,
                                                           "offset": len(ids)})
            ids += page["ids"]
            if len(page["ids"]) < page_size or len(ids) >= page["total"]:
                break
        return ids

    def workload(self, workload_id: str) -> WorkloadOut:
        return self._one(WorkloadOut, "GET", f"/workloads/{_segment(workload_id)}")

    def cancel(self, workload_id: str) -> WorkloadOut:
        return self._one(WorkloadOut, "POST", f"/workloads/{_segment(workload_id)}/cancel")

    def hold(self, workload_id: str) -> WorkloadOut:
        """Keep a pending workload from being placed until `release` (Slurm's scontrol hold)."""
        return self._one(WorkloadOut, "POST", f"/workloads/{_segment(workload_id)}/hold")

    def release(self, workload_id: str) -> WorkloadOut:
        """Let a held workload be placed again (a hold the admin set only the admin releases)."""
        return self._one(WorkloadOut, "POST", f"/workloads/{_segment(workload_id)}/release")

    def update(self, workload_id: str, *, priority: int | None = None,
               time_limit: str | float | timedelta | None = None, gpus: float | None = None,
               replicas: int | None = None) -> WorkloadOut:
        """Change a pending workload's priority (within the tenant's limit), time limit (seconds, a
        timedelta or 90s, 2h, 1:30:00), gpus per replica or replicas; Conflict once admitted."""
        seconds = None if time_limit is None else _seconds("time_limit", time_limit)
        body: dict[str, Any] = {"priority": priority, "gpus": gpus, "replicas": replicas,
                                "time_limit_s": seconds}
        return self._one(WorkloadOut, "PATCH", f"/workloads/{_segment(workload_id)}",
                         json={k: v for k, v in body.items() if v is not None})

    def requeue(self, workload_id: str, *, hold: bool = False) -> WorkloadOut:
        """Stop an admitted or running workload and send it back to pending (held with `hold`)."""
        return self._one(WorkloadOut, "POST", f"/workloads/{_segment(workload_id)}/requeue",
                         params={"hold": "true"} if hold else None)

    def cancel_array(self, array_id: str) -> ArrayCancelled:
        """Cancel every unfinished task of an array (`submit` with `array`) in one request."""
        return self._one(ArrayCancelled, "POST", f"/workloads/arrays/{_segment(array_id)}/cancel")

    def wait_array(self, array_id: str, timeout_s: float | None = None,
                   poll_s: float = 0.5) -> list[WorkloadOut]:
        """Poll until every task of the array is final; returns the tasks in index order. Raises
        NotFound for an unknown array, TimeoutError after timeout_s."""
        from gpupool.errors import NotFound

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = self.workloads(array_id=array_id, status=_UNFINISHED, limit=1)
            if not left.total:
                tasks = self._all_tasks(array_id)
                if not tasks:
                    raise NotFound(f"No array {array_id!r}; list yours with `gpupool ls`.")
                return tasks
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"Array {array_id} still has {left.total} unfinished tasks after "
                                   f"{timeout_s:g} s.")
            time.sleep(poll_s)

    def _all_tasks(self, array_id: str) -> list[WorkloadOut]:
        tasks: list[WorkloadOut] = []
        while True:
            page = self.workloads(array_id=array_id, limit=1000, offset=len(tasks), full=True)
            tasks += [item for item in page.items if isinstance(item, WorkloadOut)]
            if not page.items or len(tasks) >= page.total:
                return tasks

    def events(self, workload_id: str) -> list[EventOut]:
        return self._many(EventOut, "GET", f"/workloads/{_segment(workload_id)}/events")

    def stream_events(self, *, tenant: str | None = None, workload_ids: Sequence[str] = (),
                      after: int | None = None, follow: bool = True, reconnect_s: float = 0.0
                      ) -> Iterator[EventOut]:
        """Workload events as they are stored (`GET /events/stream`, server-sent events), oldest
        first: a tenant's own, or (admin) every tenant's or `tenant`'s, of `workload_ids` if given.
        `after`: events with a larger id (default: all stored, with `follow` only new ones). A
        dropped connection, or a followed stream that ends (its server stopped), is resumed from
        the last event received (Last-Event-ID, so nothing is missed or repeated) for up to
        `reconnect_s` seconds of trying; then Unavailable."""
        params: dict[str, Any] = {"follow": "true" if follow else "false"}
        if tenant is not None:
            params["tenant"] = tenant
        if workload_ids:
            params["workload"] = list(workload_ids)
        return self._sse("/events/stream", params, EventOut, after, follow, reconnect_s)

    def stream_service_events(self, *, tenant: str | None = None, services: Sequence[str] = (),
                              after: int | None = None, follow: bool = True, reconnect_s: float = 0.0
                              ) -> Iterator[ServiceStreamEvent]:
        """Service events (scaled, cold starts, replicas replaced ...) as they are stored
        (`GET /events/services/stream`): as stream_events, with the service events' own ids."""
        params: dict[str, Any] = {"follow": "true" if follow else "false"}
        if tenant is not None:
            params["tenant"] = tenant
        if services:
            params["service"] = list(services)
        return self._sse("/events/services/stream", params, ServiceStreamEvent, after, follow, reconnect_s)

    def _sse(self, path: str, params: dict[str, Any], model: type[M], after: int | None, follow: bool,
             reconnect_s: float) -> Iterator[M]:
        last = after
        failing_since: float | None = None
        refused_until: float | None = None
        while True:
            headers = {} if last is None else {"Last-Event-ID": str(last)}
            try:
                with self._http.stream("GET", path, params=params, headers=headers,
                                       timeout=httpx.Timeout(30.0, read=60.0)) as answer:
                    wait = _retry_after(answer)  # e.g. the tenant's open requests at their bound
                    if wait is not None:
                        now = time.monotonic()
                        refused_until = refused_until or now + self.retry_unavailable_s
                        if now + wait <= refused_until:
                            time.sleep(wait)
                            continue
                    if answer.status_code >= 400:
                        raise error_from_answer(answer.status_code, answer.read(), self.url)
                    kind = answer.headers.get("content-type", "")
                    if kind and not kind.startswith("text/event-stream"):  # a web page, or JSON
                        raise _not_a_pool(self.url, answer)
                    refused_until = None
                    failing_since = None
                    for event_id, event in _sse_events(answer.iter_lines(), model):
                        last = event_id  # the first, without an event, says where the stream starts
                        if event is not None:
                            yield event
                if not follow:
                    return
                # a followed stream ends only when its server stops: resume from the next one
                raise httpx.RemoteProtocolError("the server ended the stream")
            except httpx.TransportError as exc:
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= reconnect_s:
                    raise _unreachable(self.url, exc) from None
                time.sleep(min(1.0, reconnect_s / 10))

    def logs(self, workload_id: str, *, rank: int = 0, offset: int = 0, stream: str = "stdout",
             attempt: int | None = None, all_attempts: bool = False) -> LogsOut:
        """A pod's log from `offset`: the newest attempt's, `attempt`'s, or with `all_attempts`
        every attempt's from its start (`parts`); `attempts` lists them."""
        params: dict[str, Any] = {"rank": rank, "offset": offset, "stream": stream}
        if attempt is not None:
            params["attempt"] = attempt
        if all_attempts:
            params["all_attempts"] = "true"
        return self._one(LogsOut, "GET", f"/workloads/{_segment(workload_id)}/logs", params=params)

    def wait(self, workload_id: str, timeout_s: float | None = None, poll_s: float = 0.2) -> WorkloadOut:
        """Poll until the workload is final; raises TimeoutError after timeout_s."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            current = self.workload(workload_id)
            if current.status in ("succeeded", "failed", "cancelled"):
                return current
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"Workload {workload_id} is still {current.status} after {timeout_s:g} s.")
            time.sleep(poll_s)

    # ----------------------------------------------------------------- pool

    def nodes(self) -> list[NodeOut]:
        return self._many(NodeOut, "GET", "/nodes")

    def node(self, name: str) -> NodeOut:
        return self._one(NodeOut, "GET", f"/nodes/{_segment(name)}")

    def cordon(self, name: str) -> NodeOut:
        return self._one(NodeOut, "POST", f"/nodes/{_segment(name)}/cordon")

    def uncordon(self, name: str) -> NodeOut:
        return self._one(NodeOut, "POST", f"/nodes/{_segment(name)}/uncordon")

    def drain(self, name: str, *, now: bool = False) -> NodeOut:
        """Stop new placements on a node and let its work finish (`now`: requeue that work at once)."""
        return self._one(NodeOut, "POST", f"/nodes/{_segment(name)}/drain",
                         params={"now": "true"} if now else None)

    def fail_node(self, name: str, *, device: int | None = None) -> NodeOut:
        """Admin: inject a fault on a simulated or fake node, or on its device `device`."""
        return self._one(NodeOut, "POST", f"/nodes/{_segment(name)}/fail",
                         params=None if device is None else {"device": str(device)})

    def heal_node(self, name: str, *, device: int | None = None) -> NodeOut:
        """Admin: clear the injected fault of device `device`, or every injected fault of the node."""
        return self._one(NodeOut, "POST", f"/nodes/{_segment(name)}/heal",
                         params=None if device is None else {"device": str(device)})

    def pool(self) -> PoolSummary:
        return self._one(PoolSummary, "GET", "/pool")

    # ----------------------------------------------------------------- images

    def images(self) -> list[ImageOut]:
        """The pool's images (`submit(image=NAME)` runs pods in one)."""
        return self._many(ImageOut, "GET", "/images")

    def import_image(self, archive: str | os.PathLike[str] | IO[bytes], name: str) -> ImageOut:
        """Import a tar (or .tar.gz) of a root filesystem or of an OCI image layout as image `name`
        (admin only; it replaces an image of that name, refused while pending or running work or a
        service uses it). The file is streamed, never read whole."""
        if isinstance(archive, (str, os.PathLike)):
            with open(archive, "rb") as handle:
                return self.import_image(handle, name)
        try:
            answer = self._http.post("/images", params={"name": name}, content=_chunks(archive),
                                     headers={"Content-Type": "application/x-tar"}, timeout=None)
        except httpx.TransportError as exc:
            raise _unreachable(self.url, exc) from None
        if answer.status_code >= 400:
            raise error_from_answer(answer.status_code, answer.content, self.url)
        try:
            return ImageOut.model_validate(answer.json())
        except ValueError:  # not JSON, or not an image's (pydantic's ValidationError is a ValueError)
            raise _not_a_pool(self.url, answer) from None

    def remove_image(self, name: str) -> ImageOut:
        """Forget image `name` (admin only); raises NotFound when there is none."""
        return self._one(ImageOut, "DELETE", f"/images/{_segment(name)}")

    # ----------------------------------------------------------------- fabric

    def fabric(self, *, workload: str | None = None) -> FabricOut:
        """The live fabric (levels, switches, nodes, links with health and load); with `workload`, the
        path of that gang too (a tenant sees only its own gangs' paths)."""
        return self._one(FabricOut, "GET", "/fabric", params={"workload": workload} if workload else None)

    def fail_link(self, link: str) -> LinkChangeOut:
        """Admin: mark a fabric link failed (routes are recomputed; gangs cut off are requeued)."""
        return self._one(LinkChangeOut, "POST", "/fabric/links/fail", json={"link": link})

    def heal_link(self, link: str) -> LinkChangeOut:
        """Admin: bring a failed fabric link back."""
        return self._one(LinkChangeOut, "POST", "/fabric/links/heal", json={"link": link})

    # ----------------------------------------------------------------- admin

    def tenants(self) -> list[TenantOut]:
        return self._many(TenantOut, "GET", "/tenants")

    def create_tenant(self, name: str, *, unix_user: str | None = None, max_priority: int | None = None,
                      max_pending: int | None = None) -> TenantOut:
        """A new tenant; its `warning`, when set, is a sentence to show (the pool is single-user)."""
        body: dict[str, Any] = {"name": name, "unix_user": unix_user}
        if max_priority is not None:
            body["max_priority"] = max_priority
        if max_pending is not None:
            body["max_pending"] = max_pending
        return self._one(TenantOut, "POST", "/tenants", json=body)

    def delete_tenant(self, name: str) -> TenantDeleted:
        """Delete a tenant with nothing unfinished (Conflict, saying what still runs, otherwise): its
        queues, tokens and finished workloads, and the pool's Unix account of it on the nodes."""
        return self._one(TenantDeleted, "DELETE", f"/tenants/{_segment(name)}")

    def update_tenant(self, name: str, *, unix_user: str | None = None, clear_unix_user: bool = False,
                      max_priority: int | None = None, max_pending: int | None = None,
                      budget: float | None = None, clear_budget: bool = False,
                      budget_period: str | None = None, budget_warn: float | None = None,
                      overdraft: bool | None = None) -> TenantOut:
        """Change only what is given (clear_unix_user removes the account mapping, clear_budget the
        budget)."""
        body: dict[str, Any] = {}
        if budget is not None or clear_budget:
            body["budget"] = budget
        for key, value in (("budget_period", budget_period), ("budget_warn", budget_warn),
                           ("overdraft", overdraft)):
            if value is not None:
                body[key] = value
        if unix_user is not None or clear_unix_user:
            body["unix_user"] = unix_user
        if max_priority is not None:
            body["max_priority"] = max_priority
        if max_pending is not None:
            body["max_pending"] = max_pending
        return self._one(TenantOut, "PATCH", f"/tenants/{_segment(name)}", json=body)

    def queues(self, tenant: str | None = None) -> list[QueueOut]:
        return self._many(QueueOut, "GET", "/queues", params={"tenant": tenant} if tenant else None)

    def create_queue(self, tenant: str, name: str, quota_gpus: float | None = None, *,
                     cohort: str | None = None, borrowing_limit_gpus: float | None = None,
                     lending_limit_gpus: float | None = None, weight: float = 1.0) -> QueueOut:
        """Admin: a tenant's queue. `quota_gpus` None: no cap; queues naming one `cohort` lend each
        other unused quota (a limit None: no limit); `weight` is its tenant's DRF weight."""
        return self._one(QueueOut, "POST", "/queues", json={
            "tenant": tenant, "name": name, "quota_gpus": quota_gpus, "cohort": cohort,
            "borrowing_limit_gpus": borrowing_limit_gpus, "lending_limit_gpus": lending_limit_gpus,
            "weight": weight})

    def set_queue(self, tenant: str, name: str, *, quota_gpus: float | Keep | None = KEEP,
                  cohort: str | Keep | None = KEEP, borrowing_limit_gpus: float | Keep | None = KEEP,
                  lending_limit_gpus: float | Keep | None = KEEP, weight: float | Keep = KEEP) -> QueueOut:
        """Admin: change only the settings passed; None removes a quota, a cohort or a limit."""
        given = {"quota_gpus": quota_gpus, "cohort": cohort, "borrowing_limit_gpus": borrowing_limit_gpus,
                 "lending_limit_gpus": lending_limit_gpus, "weight": weight}
        return self._one(QueueOut, "PATCH", f"/queues/{_segment(tenant)}/{_segment(name)}",
                         json={k: v for k, v in given.items() if not isinstance(v, Keep)})

    def set_quota(self, tenant: str, name: str, quota_gpus: float | None) -> QueueOut:
        """Admin: `set_queue(tenant, name, quota_gpus=...)`."""
        return self.set_queue(tenant, name, quota_gpus=quota_gpus)

    def create_token(self, tenant: str | None = None, name: str = "", *, scope: str = "full",
                     expires_in_s: float | None = None, never_expires: bool = False) -> TokenOut:
        """A token for `tenant` (None: an admin token); expires_in_s None: the server's default."""
        return self._one(TokenOut, "POST", "/tokens", json={
            "tenant": tenant, "name": name, "scope": scope, "expires_in_s": expires_in_s,
            "never_expires": never_expires})

    def tokens(self, tenant: str | None = None) -> list[TokenInfo]:
        """Tokens without their secrets: all (admin) or one tenant's (a tenant sees only its own)."""
        return self._many(TokenInfo, "GET", "/tokens", params={"tenant": tenant} if tenant else None)

    def revoke_token(self, token_id: str) -> TokenInfo:
        return self._one(TokenInfo, "DELETE", f"/tokens/{_segment(token_id)}")

    def revoke_token_named(self, name: str, tenant: str | None = None) -> TokenInfo:
        """Revoke the unrevoked token called `name` of `tenant` (None: an admin token)."""
        from gpupool.errors import NotFound

        for token in self.tokens(tenant):
            if token.name == name and token.tenant == tenant and token.revoked_s is None:
                return self.revoke_token(token.id)
        owner = "the admin" if tenant is None else f"tenant {tenant!r}"
        raise NotFound(f"{owner.capitalize()} has no active token named {name!r}; list them with "
                       "`gpupool token ls`.")

    def create_secret(self, name: str, data: Mapping[str, str | bytes], *, tenant: str | None = None,
                      replace: bool = False) -> SecretOut:
        """Store one of the tenant's secrets (key -> value; text is stored as UTF-8); the answer and
        every later one hold its keys, never a value. `replace` overwrites one of that name."""
        encoded = {key: base64.b64encode(value.encode() if isinstance(value, str) else value).decode()
                   for key, value in data.items()}
        return self._one(SecretOut, "POST", "/secrets", json={"name": name, "tenant": tenant, "data": encoded,
                                                              "replace": replace})

    def secrets(self, tenant: str | None = None) -> list[SecretOut]:
        """The tenant's secrets (names and keys); the admin's: every tenant's, or `tenant`'s."""
        return self._many(SecretOut, "GET", "/secrets", params={"tenant": tenant} if tenant else None)

    def delete_secret(self, name: str, tenant: str | None = None) -> SecretDeleted:
        """Delete one (NotFound when the tenant has none of that name; another tenant's reads the same)."""
        return self._one(SecretDeleted, "DELETE", f"/secrets/{_segment(name)}",
                         params={"tenant": tenant} if tenant else None)

    # ----------------------------------------------------------------- inference services

    def create_service(self, spec: ServiceSpec | Mapping[str, Any]) -> ServiceOut:
        """Create a service (docs/services.md); its replicas start as the pool places them."""
        body = (spec.model_dump(mode="json", exclude_defaults=True) if isinstance(spec, ServiceSpec)
                else dict(spec))
        return self._one(ServiceOut, "POST", "/services", json=body)

    def services(self, tenant: str | None = None) -> list[ServiceOut]:
        """The tenant's services; the admin's: every tenant's, or `tenant`'s."""
        return self._many(ServiceOut, "GET", "/services", params={"tenant": tenant} if tenant else None)

    def service(self, name: str, tenant: str | None = None) -> ServiceOut:
        """One service with its replicas and recent events (NotFound: none of that name)."""
        return self._one(ServiceOut, "GET", f"/services/{_segment(name)}",
                         params={"tenant": tenant} if tenant else None)

    def service_partners(self, name: str, tenant: str | None = None) -> PartnersOut:
        """The ready endpoints of the partner of a prefill/decode service (what a replica reads to
        find its partners now; its GPUPOOL_PARTNER_ENDPOINTS is a snapshot from its launch)."""
        return self._one(PartnersOut, "GET", f"/services/{_segment(name)}/partners",
                         params={"tenant": tenant} if tenant else None)

    def update_service(self, name: str, changes: Mapping[str, Any], tenant: str | None = None) -> ServiceOut:
        """Change fields of its spec; a change of what replicas run rolls them over."""
        return self._one(ServiceOut, "PATCH", f"/services/{_segment(name)}", json={"changes": dict(changes)},
                         params={"tenant": tenant} if tenant else None)

    def scale_service(self, name: str, replicas: int, *, expected_version: int | None = None,
                      reason: str = "", tenant: str | None = None) -> ServiceOut:
        """Set its desired replicas (clamped to its bounds); Conflict when `expected_version` is stale."""
        return self._one(ServiceOut, "POST", f"/services/{_segment(name)}/scale",
                         json={"replicas": replicas, "expected_version": expected_version, "reason": reason},
                         params={"tenant": tenant} if tenant else None)

    def delete_service(self, name: str, tenant: str | None = None) -> ServiceOut:
        """Stop its replicas and delete it."""
        return self._one(ServiceOut, "DELETE", f"/services/{_segment(name)}",
                         params={"tenant": tenant} if tenant else None)

    def pool_config(self) -> dict[str, Any]:
        """The scheduling configuration the running pool uses, as `gpupool config show` (admin)."""
        return dict(self._call("GET", "/config"))

    def servers(self) -> ServersOut:
        """The servers sharing the pool's store and which one leads (admin; `gpupool server ls`)."""
        return self._one(ServersOut, "GET", "/servers")

    def audit(self, since_s: float | None = None, limit: int = 100) -> list[AuditOut]:
        """The audit log, newest first (admin)."""
        params: dict[str, Any] = {"limit": limit}
        if since_s is not None:
            params["since_s"] = since_s
        return self._many(AuditOut, "GET", "/audit", params=params)

    def whoami(self) -> WhoAmI:
        """What this client's token is: the admin's, a tenant's (which), or a hub's (neither)."""
        return self._one(WhoAmI, "GET", "/whoami")

    def usage(self, *, tenant: str | None = None, since_s: float | None = None, until_s: float | None = None,
              by: Sequence[str] = ("tenant",)) -> UsageOut:
        """Metered usage and its cost in [since_s, until_s) (default: the last 30 days), grouped by
        `by` (tenant, queue, model, priority_class, node, day); a tenant token sees only its own."""
        params: dict[str, Any] = {"by": ",".join(by)}
        for key, value in (("tenant", tenant), ("since_s", since_s), ("until_s", until_s)):
            if value is not None:
                params[key] = value
        return self._one(UsageOut, "GET", "/usage", params=params)


_RESOURCE_KEYS = frozenset(ResourcesSpec.model_fields)
_SET_BY_SERVER = frozenset({"array_index", "rendezvous", "serve_port", "service_role", "pair_with",
                            "on_behalf"})


def submit_keywords() -> list[str]:
    """Every keyword Client.submit takes (WorkloadSpec's fields follow the server's models)."""
    spec_keys = set(WorkloadSpec.model_fields) - _SET_BY_SERVER
    return sorted(spec_keys | _RESOURCE_KEYS | set(SubmitFields.__annotations__))


def spec_body(spec: WorkloadSpec | Mapping[str, Any] | None, fields: dict[str, Any]) -> dict[str, Any]:
    """The JSON body of a submission: `spec` (if any) with the keyword `fields` on top."""
    if isinstance(spec, WorkloadSpec):
        body = spec.model_dump(mode="json", exclude_none=True)
    else:
        body = dict(spec or {})
    known = submit_keywords()
    for key in fields:
        if key not in known:
            close = closest(key, known)
            hint = f"did you mean {close!r}?" if close else "see help(Client.submit)."
            raise InvalidInput(f"Client.submit() got an unexpected keyword argument {key!r}; {hint}")
    given = {key: value for key, value in fields.items() if value is not None}
    for key, field in DURATIONS.items():
        if key in given:
            if field in given:
                raise InvalidInput(f"Give {key} or {field} to Client.submit(), not both.")
            given[field] = _seconds(key, given.pop(key))
    if isinstance(given.get("command"), str | bytes):
        raise InvalidInput("command= takes a list of words such as ['python', 'train.py'], not one string; "
                           "shlex.split() turns a shell line into one.")
    for key, parse in (("mounts", parse_mount), ("secrets", parse_secret_use)):  # the CLI's forms too
        if key in given and not isinstance(given[key], str | bytes):
            given[key] = [parse(v).model_dump(exclude_defaults=True) if isinstance(v, str) else v
                          for v in given[key]]
    resources = {key: given.pop(key) for key in sorted(_RESOURCE_KEYS & given.keys())}
    if "resources" in given or resources:
        base = given.pop("resources", None) or body.get("resources") or {}
        if not isinstance(base, Mapping):
            raise InvalidInput("The spec's resources must be a mapping such as {'gpus': 0.25}.")
        resources = {**base, **resources}
        body["resources"] = resources
    body.update(given)
    body = _plain(body)
    if not body:
        raise InvalidInput("Client.submit() needs a spec or keyword arguments, e.g. command=['python', "
                           "'train.py'], gpus=0.25.")
    return body


DURATIONS = {"time_limit": "time_limit_s", "checkpoint_every": "checkpoint_interval_s"}
"""Client.submit's duration keywords and the spec field each one sets, in seconds."""


def _seconds(key: str, value: object) -> float:
    """Seconds from seconds, a timedelta, or a duration as `submit --time-limit` takes."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    try:
        return duration_s(str(value))
    except ValueError:
        raise InvalidInput(f"{key} takes seconds, a timedelta or a duration such as 90s, 30m, 2h, 1d or "
                           f"1:30:00, got {value!r}.") from None


def _plain(value: Any) -> Any:
    """JSON-ready: tuples and other sequences as lists, mappings as dicts."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [_plain(item) for item in value]
    return value


def _chunks(handle: IO[bytes], size: int = 1 << 20) -> Iterator[bytes]:
    while chunk := handle.read(size):
        yield chunk


def _list_params(status: Sequence[str], tenant: str | Sequence[str] | None,
                 queue: str | Sequence[str] | None, since_s: float | None,
                 array_id: str | Sequence[str] | None = None,
                 workload_id: str | Sequence[str] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key, value in (("status", status), ("tenant", tenant), ("queue", queue), ("array_id", array_id),
                       ("workload_id", workload_id)):
        if value:
            params[key] = [value] if isinstance(value, str) else list(value)
    if since_s is not None:
        params["since_s"] = since_s
    return params


def _verify(url: str) -> ssl.SSLContext:
    """How to check an https:// server: the private CA's bundle when one is named, else the system's."""
    bundle = ca_bundle() if url.startswith("https://") else None
    if bundle is None:
        return _default_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    try:
        return ssl.create_default_context(cafile=bundle)
    except ssl.SSLError as exc:
        raise InvalidInput(f"The CA bundle {bundle!r} holds no usable PEM certificate ({exc.reason or exc}); "
                           "point GPUPOOL_CA_BUNDLE at the CA's PEM certificate.") from None


@functools.cache
def _default_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    """What httpx builds for verify=True (the CAs of SSL_CERT_FILE or SSL_CERT_DIR when set, else
    certifi's), once per process and setting: loading the CAs takes ~17 ms of CPU, most of what a
    Client costs to make, and a program (a test, a dashboard, a script) may make many."""
    return httpx.create_ssl_context()


def _not_a_pool(url: str, answer: httpx.Response) -> InvalidInput:
    """The error for an answer that is no gpupool server's (a web page where JSON was expected)."""
    kind = answer.headers.get("content-type", "").split(";")[0] or "no content type"
    return InvalidInput(f"The server at {url} answered HTTP {answer.status_code} with {kind}, not a gpupool "
                        "answer: it does not look like a gpupool server; check the URL (GPUPOOL_URL is "
                        "http://HOST:PORT, without the dashboard's /ui or another path).")


def _unknown_shape(url: str, what: str) -> InvalidInput:
    return InvalidInput(f"The server at {url} answered with JSON that is not {what} as this client knows "
                        "it: it is not a gpupool server, or one of a release far from this client's; check "
                        "the URL (GPUPOOL_URL) and the server's release (GET /health).")


def _sse_events(lines: Iterator[str], model: type[M]) -> Iterator[tuple[int, M | None]]:
    """(id, event) for each block of a server-sent event stream that has an id; the event is None
    for a block without data (the stream's start). Comments (keep-alive pings) are skipped."""
    event_id: int | None = None
    data = ""
    for line in lines:
        if line.startswith("id:"):
            event_id = int(line[3:].strip())
        elif line.startswith("data:"):
            data = line[5:].strip()
        elif not line:
            if event_id is not None:
                yield event_id, model.model_validate_json(data) if data else None
            event_id, data = None, ""


def _retry_after(answer: httpx.Response) -> float | None:
    """Seconds to wait before sending the request again (`lite_http.retry_wait`), else None."""
    return retry_wait(answer.status_code, answer.headers.get("retry-after"))


def _cut_off(url: str, exc: httpx.TransportError) -> TooLarge | None:
    """The sentence for a large request whose connection the server closed while it was being sent
    (most likely: past its request body limit), else None."""
    if not isinstance(exc, httpx.WriteError | httpx.ReadError | httpx.RemoteProtocolError):
        return None
    try:
        size = int(exc.request.headers.get("content-length", "0"))
    except (RuntimeError, ValueError):  # no request attached, or a streamed body of unknown length
        return None
    if size <= LARGE_BODY_BYTES:
        return None
    return TooLarge(f"The server at {url} closed the connection while the {size / 2**20:.1f} MiB request was "
                    "being sent, most likely because it is over the pool's request body limit "
                    "(gpupool up --max-request-body, 1 MiB by default); put large data in a file the pods "
                    "read, not in the request.")


def _unreachable(url: str, exc: httpx.TransportError) -> Unavailable:
    """One sentence for a failed connection, naming the fix for the TLS mistakes people make."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return Unavailable(
            f"The server at {url} presented a certificate this machine does not trust "
            f"({cause.verify_message}); if your pool uses a private CA, point GPUPOOL_CA_BUNDLE at its "
            "PEM certificate.", permanent=True,  # retrying cannot help (see cli/_reconnect.py)
        )
    if cause is not None:
        return Unavailable(f"TLS with the server at {url} failed ({cause.reason or cause}); check that "
                           "GPUPOOL_URL's scheme (http or https) matches what the server serves.",
                           permanent=True)
    if isinstance(exc, httpx.RemoteProtocolError) and url.startswith("http://"):
        return Unavailable(f"The server at {url} closed the connection without answering; if it serves "
                           "HTTPS, use an https:// URL in GPUPOOL_URL.")
    return Unavailable(f"Cannot reach the gpupool server at {url} ({exc}); start it with `gpupool up` "
                       "or point GPUPOOL_URL at it.")


def _segment(value: str) -> str:
    if not value or "/" in value or value in (".", ".."):
        raise InvalidInput(f"{value!r} is not a valid id or name.")
    return value
