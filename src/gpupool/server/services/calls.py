"""Remote function calls: sessions as function workloads, their calls, and what worker pods take and give.

A session is an ordinary workload (quota, priority, preemption, metering and cancel apply) whose
command is the pool's own interpreter running `gpupool.remote.worker`. Its pod gets GPUPOOL_URL
and a call token (auth.call_token) that lets it take only its own workload's calls, and only while
it runs. Inputs and results are pickles the server stores and hands on without reading them; a
finished result survives a server restart. Only the submitting tenant (and the admin) read calls.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import logging
import os
import re
import secrets
import shutil
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.agent.identity import BASE_PATH
from gpupool.api.calls import (
    MAX_PAYLOAD_BYTES,
    CallCreate,
    CallDone,
    CallOut,
    CallStatus,
    SessionCreate,
    SessionOut,
    WorkerWork,
)
from gpupool.api.workloads import WorkloadSpec
from gpupool.core.model import WorkloadStatus
from gpupool.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized
from gpupool.server.auth import Principal, call_token, call_token_pod
from gpupool.server.db import Store
from gpupool.server.orm import Base, RemoteCallRow, RemoteKeyRow, RemoteSessionRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import workloads as workloads_service
from gpupool.server.services.locks import own_rows
from gpupool.server.services.submit_writer import commit
from gpupool.server.states import ACTIVE_POD_STATES

log = logging.getLogger("gpupool.calls")

POOL_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
WORKER_PYTHON_ENV = "GPUPOOL_WORKER_PYTHON"
"""The interpreter pods run the worker with, when not this server's own (same minor version)."""
POD_URL_ENV = "GPUPOOL_POD_API_URL"
"""Where pods reach this server's API, when not at its own listening address (a scale-out pool)."""
CALL_TOKEN_ENV = "GPUPOOL_CALL_TOKEN"
WORKER_MODULE = "gpupool.remote.worker"
"""A workload whose command ends `-m gpupool.remote.worker` gets a call token in its pods; the token
takes only the calls of its own workload's session, which only this service creates."""
RESULT_KEEP_S = 7 * 86400.0
"""Sessions idle this long are deleted with their calls and results."""
PRUNE_EVERY_S = 3600.0
_MIB = 2**20
_keys: weakref.WeakKeyDictionary[Store, bytes] = weakref.WeakKeyDictionary()
_keys_lock = threading.Lock()
_next_prune: weakref.WeakKeyDictionary[Store, float] = weakref.WeakKeyDictionary()
_S = Base.metadata.tables["remote_sessions"]
_C = Base.metadata.tables["remote_calls"]
_W = Base.metadata.tables["workloads"]
_P = Base.metadata.tables["pods"]
_QUEUED = (select(_C.c.id, _C.c.payload).where(_C.c.status == CallStatus.QUEUED.value)
           .order_by(_C.c.submitted_s, _C.c.id).limit(1))


@dataclass(frozen=True, slots=True)
class WorkerPod:
    """The pod a call token was made for, and the session (workload) whose calls it may take."""

    pod_id: str
    session_id: str


POD_CHECK_S = 0.5
"""How long a worker pod's token is trusted without looking at its pod again."""
_active_pods: dict[str, tuple[WorkerPod, float]] = {}


# ---------------------------------------------------------------------- the pods' token and URL

def _key(store: Store, *, create: bool) -> bytes | None:
    """The key signing call tokens (made once, kept in the store for every server process)."""
    with _keys_lock:
        known = _keys.get(store)
    if known is not None:
        return known
    with store.read() as session:
        secret = session.scalar(select(RemoteKeyRow.secret).where(RemoteKeyRow.id == 1))
    if secret is None and create:
        try:
            with store.write() as session:
                session.add(RemoteKeyRow(id=1, secret=secrets.token_hex(32), created_s=0.0))
        except IntegrityError:  # another server process made it first
            pass
        with store.read() as session:
            secret = session.scalar(select(RemoteKeyRow.secret).where(RemoteKeyRow.id == 1))
    if secret is None:
        return None
    key = bytes.fromhex(secret)
    with _keys_lock:
        _keys[store] = key
    return key


def pod_api_url(rt: Runtime) -> str:
    """The URL pods reach the API at: GPUPOOL_POD_API_URL, else this server's listening address."""
    explicit = os.environ.get(POD_URL_ENV, "").strip().rstrip("/")
    if explicit:
        return explicit
    host = rt.settings.host
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"{rt.settings.scheme}://{host}:{rt.settings.port}"


def pod_env(rt: Runtime, pod_id: str) -> dict[str, str]:
    """A function workload's pod: where the API is and its call token (the key exists: the
    session's creation made it). Reads the store once per process, never writes."""
    key = _key(rt.store, create=False)
    if key is None:  # cannot happen after open_session; the worker then says it has no token
        log.warning("no call-token key in the store; pod %s gets no call token", pod_id)
        return {"GPUPOOL_URL": pod_api_url(rt)}
    return {"GPUPOOL_URL": pod_api_url(rt), CALL_TOKEN_ENV: call_token(key, pod_id)}


# ---------------------------------------------------------------------- payloads and rows

def decode_payload(text: str, what: str) -> bytes:
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"The {what} is not valid base64; send the pickle base64-encoded.") from None
    check_size(len(data), what)
    return data


def check_size(size: int, what: str) -> None:
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidInput(f"The {what} pickles to {size / _MIB:.1f} MiB, over the pool's limit of "
                           f"{MAX_PAYLOAD_BYTES // _MIB} MiB per call; pass a path or URL to large data "
                           "instead, or split it into smaller calls.", size=size, limit=MAX_PAYLOAD_BYTES)


def _call_out(row: RemoteCallRow | Row[Any]) -> CallOut:
    result = None if row.result is None else base64.b64encode(row.result).decode()
    return CallOut(id=row.id, session_id=row.session_id, status=CallStatus(row.status), attempts=row.attempts,
                   submitted_s=row.submitted_s, started_s=row.started_s, finished_s=row.finished_s,
                   pod_id=row.pod_id, result=result, error=row.error, traceback=row.traceback)


def _session_out(row: RemoteSessionRow, workload_status: str, call: CallOut | None = None) -> SessionOut:
    return SessionOut(id=row.id, tenant=row.tenant, one_shot=row.one_shot, closed=row.closed,
                      workload_status=workload_status, pod_id=row.pod_id, call=call)


def _new_call(session_id: str, tenant: str, payload: bytes, now: float) -> RemoteCallRow:
    return RemoteCallRow(id="c-" + secrets.token_hex(8), session_id=session_id, tenant=tenant,
                         status=CallStatus.QUEUED.value, payload=payload, result=None, error="",
                         traceback="", pod_id="", attempts=0, submitted_s=now)


def _visible_session(session: Session, who: Principal, session_id: str, *, lock: bool = False
                     ) -> RemoteSessionRow:
    query = select(RemoteSessionRow).where(RemoteSessionRow.id == session_id)
    if lock:
        query = own_rows(query, who, RemoteSessionRow.tenant).with_for_update()
    row = session.scalars(query).first()
    if row is None or not who.may_see(row.tenant):
        raise NotFound(f"No session {session_id!r}; open one with pool.session().", session=session_id)
    return row


def _visible_call(session: Session, who: Principal, call_id: str) -> RemoteCallRow:
    row = session.get(RemoteCallRow, call_id)
    if row is None or not who.may_see(row.tenant):
        raise NotFound(f"No call {call_id!r}; it may have been deleted after {RESULT_KEEP_S / 86400:g} "
                       "days, or it belongs to another tenant.", call=call_id)
    return row


# ---------------------------------------------------------------------- the tenant's side

def check_python(python: str) -> None:
    """Refuse a client whose Python minor version differs from the pool's (pickles would not load)."""
    if python != POOL_PYTHON:
        raise InvalidInput(f"This client runs Python {python} but the pool runs Python {POOL_PYTHON}; call "
                           f"from Python {POOL_PYTHON}, since functions travel pickled and a pickle needs "
                           "the same Python on both sides.", client_python=python, pool_python=POOL_PYTHON)


def _others_can_run(path: str) -> bool:
    """Whether any account may run `path` (every directory above it and the file open to others)."""
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    try:
        return all(os.stat(os.sep.join(parts[:end]) or os.sep).st_mode & 0o001
                   for end in range(1, len(parts) + 1))
    except OSError:
        return False


@functools.cache
def worker_python() -> tuple[str, str]:
    """(interpreter, PYTHONPATH) of the pods' worker: this server's own interpreter and packages.
    Where pods run as other accounts (a root server) that cannot enter this interpreter's directory,
    the system's python of the same minor version runs it, with this server's import paths; or the
    interpreter GPUPOOL_WORKER_PYTHON names, with those paths."""
    import cloudpickle

    roots = list(dict.fromkeys(
        os.path.dirname(os.path.dirname(os.path.abspath(str(module.__file__))))
        for module in (sys.modules["gpupool"], cloudpickle)))
    paths = os.pathsep.join(roots)
    explicit = os.environ.get(WORKER_PYTHON_ENV, "").strip()
    if explicit:
        return explicit, paths
    if os.geteuid() != 0 or _others_can_run(sys.executable):
        return sys.executable, ""
    system = shutil.which(f"python{POOL_PYTHON}", path=BASE_PATH)
    if not system:
        return sys.executable, ""
    return system, paths if all(_others_can_run(root) for root in roots) else _staged_worker()


def _staged_worker() -> str:
    """A copy of all the worker imports (gpupool's two package stubs, its module, and cloudpickle) in
    a fresh directory every account may read but only this one write, for when this server's import
    paths sit below a directory only its owner can enter (a checkout in a private directory). Removed
    when the server exits."""
    import atexit
    import tempfile
    from pathlib import Path

    import cloudpickle

    root = Path(tempfile.mkdtemp(prefix="gpupool-worker-"))
    atexit.register(shutil.rmtree, root, True)
    package = Path(str(sys.modules["gpupool"].__file__)).parent
    for part in ("__init__.py", "remote/__init__.py", "remote/worker.py"):  # WORKER_MODULE and its parents
        (root / "gpupool" / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(package / part, root / "gpupool" / part)
    shutil.copytree(Path(str(cloudpickle.__file__)).parent, root / "cloudpickle",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for path in (root, *root.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return str(root)


def _workload_spec(body: SessionCreate, rt: Runtime) -> WorkloadSpec:
    python, paths = worker_python()
    env = {**body.env, "PYTHONUNBUFFERED": "1"}
    command = [python, "-P", "-m", WORKER_MODULE]
    if body.image is not None:  # the image's own Python, the worker's code carried in (call_images.py)
        from gpupool.server.services.call_images import worker_command

        command, paths = worker_command(rt, body.image), ""
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (paths, body.env.get("PYTHONPATH", "")) if p)
    return WorkloadSpec.model_validate({
        "command": command, "name": body.name or "function", "image": body.image,
        "tenant": body.tenant, "queue": body.queue, "priority": body.priority,
        "priority_class": body.priority_class, "time_limit_s": body.time_limit_s,
        "resources": body.resources, "env": env})


def refuse_admin_session(who: Principal, tenant: str | None) -> None:
    """The admin token opens remote-function sessions of the default tenant only, here and at a
    federation's hub (which opens them on a member as the tenant): as `gpupool exec` refuses it
    (routers/execs.py), the results are pickles the caller's SDK loads, and code running as that
    tenant's account can post them (it reads the worker's call token from /proc as the same
    account), so the tenant would run code as the admin."""
    if who.is_admin and tenant not in (None, "default"):
        raise Forbidden(f"Remote functions for tenant {tenant} run as its account, and their results "
                        "are pickles that the caller's SDK loads, which runs what code of that account "
                        "put in them: the admin token opens sessions of the default tenant only. Use one "
                        f"of {tenant}'s tokens.")


def _crossed_session(session_id: str, tenant: str, opened_by: str, caller: str | None) -> str:
    """Why a call may not go to a session opened by the other side: a call is code that runs in the
    session's worker, next to the other side's calls, whose results their caller loads."""
    if opened_by:
        return (f"Session {session_id} was opened by the {opened_by} for tenant {tenant}; its worker runs "
                f"calls of the {opened_by}'s only. Open a session of your own with pool.session().")
    return (f"Session {session_id} was opened with one of tenant {tenant}'s own tokens and runs as its "
            f"account; the {caller} does not run code there. Open a session of your own with pool.session().")


def open_session(rt: Runtime, who: Principal, body: SessionCreate) -> SessionOut:
    """Store the session (and its first call), then submit its workload like any other; refused as
    a whole (nothing kept) when the submission is."""
    check_python(body.python)
    refuse_admin_session(who, body.tenant)
    payload = None if body.call is None else decode_payload(body.call.payload, "function and its arguments")
    _key(rt.store, create=True)  # before any of its pods is launched (the scheduler only reads it)
    _prune(rt)
    submission = workloads_service.prepare(rt, who, _workload_spec(body, rt))
    now = rt.clock()
    row = RemoteSessionRow(id=submission.id, tenant=submission.tenant, one_shot=body.one_shot, closed=False,
                           idle_timeout_s=body.idle_timeout_s, last_active_s=now, pod_id="",
                           python=body.python, created_s=now)
    call = None if payload is None else _new_call(row.id, row.tenant, payload, now)
    with rt.store.write() as session:  # first, so that its pod always finds it
        session.add(row)
        if call is not None:
            session.flush()
            session.add(call)
    commit(rt, [submission])
    if submission.error is not None:
        with rt.store.write() as session:
            session.execute(delete(RemoteSessionRow).where(RemoteSessionRow.id == row.id))
        raise submission.error
    return _session_out(row, WorkloadStatus.PENDING.value, None if call is None else _call_out(call))


def get_session(rt: Runtime, who: Principal, session_id: str) -> SessionOut:
    with rt.store.read() as session:
        row = _visible_session(session, who, session_id)
        status = session.scalar(select(WorkloadRow.status).where(WorkloadRow.id == row.id)) or ""
        return _session_out(row, status)


def submit_call(rt: Runtime, who: Principal, session_id: str, body: CallCreate) -> CallOut:
    """Queue a call on an open session (Core statements: this is the warm path)."""
    payload = decode_payload(body.payload, "function and its arguments")
    now = rt.clock()
    with rt.store.write() as session:
        conn = session.connection()
        query = own_rows(select(_S.c.tenant, _S.c.closed, _S.c.one_shot).where(_S.c.id == session_id),
                         who, _S.c.tenant)
        row = conn.execute(query.with_for_update()).first()
        if row is None or not who.may_see(row.tenant):
            raise NotFound(f"No session {session_id!r}; open one with pool.session().", session=session_id)
        worker = conn.execute(select(_W.c.status, _W.c.spec).where(_W.c.id == session_id)).first()
        status = worker.status if worker is not None else ""
        if row.closed or row.one_shot or (status and WorkloadStatus(status).is_final):
            why = "one-shot" if row.one_shot and not row.closed else "closed"
            raise Conflict(f"Session {session_id} is {why}; open a new one with pool.session().",
                           session=session_id)
        opened_by = str((worker.spec or {}).get("on_behalf") or "") if worker is not None else ""
        if bool(opened_by) != (who.on_behalf is not None):
            raise Forbidden(_crossed_session(session_id, row.tenant, opened_by, who.on_behalf))
        call = _new_call(session_id, row.tenant, payload, now)
        conn.execute(insert(_C).values(**{c.name: getattr(call, c.name) for c in _C.columns}))
        conn.execute(update(_S).where(_S.c.id == session_id).values(last_active_s=now))
    return _call_out(call)


def get_call(rt: Runtime, who: Principal, call_id: str) -> CallOut:
    """The call as it stands; one whose workload ended without answering it is failed here."""
    with rt.store.read() as session:
        row = _visible_call(session, who, call_id)
        if CallStatus(row.status).is_final:
            return _call_out(row)
        workload = session.get(WorkloadRow, row.session_id)
        if workload is None or not WorkloadStatus(workload.status).is_final:
            return _call_out(row)
    _settle_unanswered(rt, row.session_id)
    with rt.store.read() as session:
        return _call_out(_visible_call(session, who, call_id))


def _settle_unanswered(rt: Runtime, session_id: str) -> None:
    """Its workload ended: every call it left unanswered is failed (cancelled: cancelled), saying why."""
    with rt.store.write() as session:
        workload = session.get(WorkloadRow, session_id)
        if workload is None or not WorkloadStatus(workload.status).is_final:
            return
        cancelled = workload.status == WorkloadStatus.CANCELLED.value
        status = CallStatus.CANCELLED if cancelled else CallStatus.FAILED
        message = (f"Its workload {session_id} {workload.status} before answering it"
                   + (f": {workload.message}" if workload.message else "."))
        session.execute(update(RemoteCallRow).where(
            RemoteCallRow.session_id == session_id,
            RemoteCallRow.status.in_((CallStatus.QUEUED.value, CallStatus.RUNNING.value)),
        ).values(status=status.value, error=message[:1024], finished_s=rt.clock(), payload=b""))
        session.execute(update(RemoteSessionRow).where(RemoteSessionRow.id == session_id).values(closed=True))


def cancel_call(rt: Runtime, who: Principal, call_id: str) -> CallOut:
    """Cancel a call: a queued call of a session is dropped; a one-shot call, or a running one (which
    only stopping its pod can end), cancels its workload."""
    now = rt.clock()
    with rt.store.write() as session:
        row = _visible_call(session, who, call_id)
        one_shot = bool(session.scalar(select(RemoteSessionRow.one_shot)
                                       .where(RemoteSessionRow.id == row.session_id)))
        conn = session.connection()
        # What a cancel does depends on the call's status, which a worker changes at the same time
        # (next_call hands it out, finish_call answers it): set only where it is still the status
        # read, else read it again
        status, stop_workload = row.status, False
        while not CallStatus(status).is_final:
            stop_workload = one_shot or status == CallStatus.RUNNING.value
            error = "Cancelled by the user" + (f"; its workload {row.session_id} was cancelled too."
                                               if stop_workload else ".")
            if conn.execute(update(_C).where(_C.c.id == call_id, _C.c.status == status).values(
                    status=CallStatus.CANCELLED.value, finished_s=now, payload=b"", error=error)).rowcount:
                break
            status = conn.execute(select(_C.c.status).where(_C.c.id == call_id)).scalar_one()
        else:  # final before this cancel: as it was
            stop_workload = False
        out = _call_out(conn.execute(select(_C).where(_C.c.id == call_id)).one())
    if stop_workload:
        with contextlib.suppress(Conflict):  # it had ended already
            workloads_service.cancel(rt, who, row.session_id)
        _settle_unanswered(rt, row.session_id)
    return out


def close_session(rt: Runtime, who: Principal, session_id: str) -> SessionOut:
    """No more calls: the worker stops once the queued ones are answered. A session whose workload
    has not started and has nothing to do is cancelled (it would start a pod only to stop it)."""
    with rt.store.write() as session:
        row = _visible_session(session, who, session_id, lock=True)
        row.closed = True
        status = session.scalar(select(WorkloadRow.status).where(WorkloadRow.id == row.id)) or ""
        unanswered = session.scalar(select(RemoteCallRow.id).where(
            RemoteCallRow.session_id == row.id,
            RemoteCallRow.status.in_((CallStatus.QUEUED.value, CallStatus.RUNNING.value))).limit(1))
    if status == WorkloadStatus.PENDING.value and unanswered is None:
        with contextlib.suppress(Conflict):  # it started or ended meanwhile
            workloads_service.cancel(rt, who, session_id)
    return get_session(rt, who, session_id)


def _prune(rt: Runtime) -> None:
    """Delete sessions idle for RESULT_KEEP_S with their calls (at most once an hour per process)."""
    now = rt.clock()
    if _next_prune.get(rt.store, 0.0) > now:
        return
    _next_prune[rt.store] = now + PRUNE_EVERY_S
    with rt.store.write() as session:
        old = select(RemoteSessionRow.id).where(RemoteSessionRow.last_active_s < now - RESULT_KEEP_S)
        session.execute(delete(RemoteCallRow).where(RemoteCallRow.session_id.in_(old)))
        session.execute(delete(RemoteSessionRow).where(RemoteSessionRow.last_active_s < now - RESULT_KEEP_S))


# ---------------------------------------------------------------------- the worker pod's side

_POD_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def known_worker_pod(rt: Runtime, authorization: str | None) -> WorkerPod | None:
    """The pod of a valid call token when it was found active within POD_CHECK_S (no I/O), else
    None (then ask worker_pod)."""
    with _keys_lock:
        key = _keys.get(rt.store)
    if key is None:
        return None
    try:
        pod_id = call_token_pod(key, authorization)
    except Unauthorized:
        return None
    known = _active_pods.get(pod_id)
    return known[0] if known is not None and time.monotonic() - known[1] <= POD_CHECK_S else None


def worker_pod(rt: Runtime, authorization: str | None) -> WorkerPod:
    """The pod a call token names, while that pod is active (the token dies with it, within
    POD_CHECK_S: an active pod is looked up at most that often)."""
    key = _key(rt.store, create=False)
    if key is None:
        raise Unauthorized("The call token is not valid.", reason="no call-token key")
    pod_id = call_token_pod(key, authorization)
    mono = time.monotonic()
    with rt.store.read() as session:
        row = session.execute(select(_P.c.workload_id, _P.c.status).where(_P.c.id == pod_id)).first() \
            if _POD_ID.match(pod_id) else None
    if row is None or row.status not in ACTIVE_POD_STATES:
        _active_pods.pop(pod_id, None)
        raise Unauthorized("The call token's pod has ended; the token ended with it.", reason="pod ended")
    pod = WorkerPod(pod_id=pod_id, session_id=row.workload_id)
    if len(_active_pods) > 10_000:
        _active_pods.clear()
    _active_pods[pod_id] = (pod, mono)
    return pod


def finish_call(rt: Runtime, pod: WorkerPod, done: CallDone) -> CallOut | None:
    """Store a worker's answer; the call as it now stands, or None when the pod no longer held it
    (cancelled meanwhile, or not its call: the answer is dropped)."""
    result = None if done.result is None else decode_payload(done.result, "function's result")
    now = rt.clock()
    status = CallStatus.SUCCEEDED if done.ok else CallStatus.FAILED
    with rt.store.write() as session:
        conn = session.connection()
        answered = conn.execute(update(_C).where(
            _C.c.id == done.call_id, _C.c.session_id == pod.session_id, _C.c.pod_id == pod.pod_id,
            _C.c.status == CallStatus.RUNNING.value,
        ).values(status=status.value, result=result, error=done.error, traceback=done.traceback,
                 finished_s=now, payload=b"")).rowcount
        if not answered:
            return None
        conn.execute(update(_S).where(_S.c.id == pod.session_id).values(last_active_s=now))
        return _call_out(conn.execute(select(_C).where(_C.c.id == done.call_id)).one())


def next_call(rt: Runtime, pod: WorkerPod) -> WorkerWork | None:
    """The session's oldest queued call, now held by this pod; `stop` when the session is over;
    None when there is nothing yet (the caller waits and asks again)."""
    now = rt.clock()
    with rt.store.read() as session:  # most asks find nothing to do: they take no write lock
        conn = session.connection()
        row = conn.execute(select(_S).where(_S.c.id == pod.session_id)).first()
        if row is not None and row.pod_id == pod.pod_id and not _stop_reason(conn, row, now) \
                and conn.execute(_QUEUED.where(_C.c.session_id == row.id)).first() is None:
            return None
    with rt.store.write() as session:
        conn = session.connection()
        row = conn.execute(select(_S).where(_S.c.id == pod.session_id).with_for_update()).first()
        if row is None:
            return WorkerWork(stop=True, reason="its session is gone")
        if row.pod_id != pod.pod_id:  # a new pod (after a preemption): what the last one held runs again
            conn.execute(update(_C).where(_C.c.session_id == row.id, _C.c.status == CallStatus.RUNNING.value)
                         .values(status=CallStatus.QUEUED.value, pod_id=""))
            conn.execute(update(_S).where(_S.c.id == row.id).values(pod_id=pod.pod_id))
        # A cancel sets a queued call's status at the same time (cancel_call, where it is still the
        # status it read): handed out only where it is still queued, else the next one is read
        while (call := conn.execute(_QUEUED.where(_C.c.session_id == row.id)).first()) is not None:
            still_queued = (_C.c.id == call.id, _C.c.status == CallStatus.QUEUED.value)
            if conn.execute(update(_C).where(*still_queued).values(
                    status=CallStatus.RUNNING.value, pod_id=pod.pod_id, started_s=now,
                    attempts=_C.c.attempts + 1)).rowcount:
                return WorkerWork(call_id=call.id, payload=base64.b64encode(call.payload).decode())
        reason = _stop_reason(conn, row, now)
        if reason:
            conn.execute(update(_S).where(_S.c.id == row.id).values(closed=True))
            return WorkerWork(stop=True, reason=reason)
    return None


def _stop_reason(conn: Connection, row: Row[Any], now: float) -> str:
    """Why a worker with nothing queued should stop now ('' = keep waiting)."""
    if row.one_shot and conn.execute(select(_C.c.id).where(_C.c.session_id == row.id).limit(1)).first():
        return "its one call was answered"
    if row.closed:
        return "its session was closed"
    if now - row.last_active_s >= row.idle_timeout_s:
        return f"no call came for {row.idle_timeout_s:g} s (the session's idle timeout)"
    return ""
