"""`gpupool exec`: a WebSocket that runs a command inside a live pod of the caller's workload.

The client opens `/api/v1/workloads/{id}/exec` with its tenant token and sends one JSON text message:
`{"command": [...], "rank": 0, "pty": false, "rows": 0, "cols": 0}`. The server checks the token
(another tenant's workload is 404, as if it did not exist; the admin token is refused: an exec runs
as the tenant's account, so it takes the tenant's token, and an admin acts through the pool's verbs,
which are audited; work the admin or a hub submitted for the tenant is refused too: it runs as the
tenant's on-behalf account, beside their other work for it), finds the live pod and asks the
provider to start the command inside it (its account, network namespace, cgroup and environment:
agent/execs.py). Then binary frames, the first
byte a channel: client -> server 0 stdin, 3 resize `{"rows", "cols"}`, 4 end of stdin, 5 signal
`{"signal": N}`; server -> client 1 stdout, 2 stderr. It ends with one text message, `{"exit_code":
N}` or `{"error": sentence, "status": http status}`, and the close.

Everything runs on the event loop without blocking it: the agent's ends of the exec's streams are
non-blocking descriptors read when readable and written when writable. Flow is bounded both ways: a
stream is read again only once its previous frame was sent (a slow client stops the command at a
full pipe, not the server's memory), and the next client frame is received only once the previous
stdin was written. The stream ends when the client goes away (the exec is killed) or the command
ended. Only the exec's own descriptors are read, so another pod cannot reach this stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from sqlalchemy import select

from gpupool.core.model import WorkloadStatus
from gpupool.errors import Forbidden, GpupoolError, InvalidInput, NotFound, ProviderError
from gpupool.server.orm import PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.states import PodState

router = APIRouter(prefix="/workloads", tags=["workloads"])
STDIN, STDOUT, STDERR, RESIZE, STDIN_EOF, SIGNAL = 0, 1, 2, 3, 4, 5
READ_CHUNK = 64 * 1024
MAX_FRAME = 1 << 20
FIRST_MESSAGE_S = 30.0
DRAIN_AFTER_EXIT_S = 5.0
"""How long output still open after the command ended (a child it left holds the pipe) is read."""
SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGKILL, signal.SIGUSR1,
           signal.SIGUSR2, signal.SIGWINCH, signal.SIGCONT, signal.SIGSTOP, signal.SIGTSTP}


def live_pod(rt: Runtime, tenant: str | None, workload_id: str, rank: int) -> tuple[str, str]:
    """(node, pod id) of the workload's live pod of `rank`, or the error that says why there is none."""
    if tenant is None:
        raise Forbidden("gpupool exec runs a command as the workload's tenant; use that tenant's token "
                        "(the admin token does not run commands inside tenants' pods).")
    with rt.store.read() as session:
        row = session.get(WorkloadRow, workload_id)
        if row is None or row.tenant != tenant:
            raise NotFound(f"No workload {workload_id!r}; list yours with `gpupool ls`.")
        if row.spec.get("on_behalf"):  # its account runs others' work for the tenant (their calls too)
            raise Forbidden(f"Workload {workload_id} was submitted by the {row.spec['on_behalf']} for tenant "
                            f"{tenant} and runs as {tenant}'s on-behalf account, which gpupool exec does not "
                            "enter: exec runs inside the tenant's own work. Submit it with one of "
                            f"{tenant}'s tokens to exec into it.")
        status = WorkloadStatus(row.status)
        if status.is_final:
            raise NotFound(f"Workload {workload_id} has ended ({status.value}); exec runs only inside a "
                           "running workload. Start a new allocation with `gpupool alloc`.")
        pod = session.execute(
            select(PodRow.id, PodRow.node).where(PodRow.workload_id == workload_id, PodRow.rank == rank,
                                                 PodRow.status == PodState.RUNNING.value)
            .order_by(PodRow.attempt.desc())).first()
    if pod is None:
        raise NotFound(f"Workload {workload_id} has no running pod of rank {rank} (it is {status.value}); "
                       + ("give a rank from 0 to its replicas less one" if status is WorkloadStatus.RUNNING
                          else "try again once it is running")
                       + f" (`gpupool show {workload_id}` lists its pods).")
    return str(pod.node), str(pod.id)


MAX_RANK = 2**31
"""Past any gang's ranks (and the store's 32-bit integer column)."""
MAX_WINDOW = 10_000
"""A terminal's rows or columns at most (the agent ignores a resize past it)."""


def _request(raw: str) -> tuple[list[str], int, bool, int, int]:
    try:
        body = json.loads(raw)
        command = body["command"]
        rank, pty = int(body.get("rank", 0)), bool(body.get("pty", False))
        rows, cols = int(body.get("rows", 0)), int(body.get("cols", 0))
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):  # Overflow: int(1e400)
        raise InvalidInput('Send {"command": ["program", ...]} first (gpupool exec ID -- CMD).') from None
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise InvalidInput("The command must be a non-empty list of strings: gpupool exec ID -- CMD.")
    if not 0 <= rank < MAX_RANK:
        raise InvalidInput(f"The rank must be a pod's rank in its gang, 0 to {MAX_RANK - 1}, not {rank}.")
    if not (0 <= rows < MAX_WINDOW and 0 <= cols < MAX_WINDOW):
        raise InvalidInput(f"A terminal's rows and columns are 0 to {MAX_WINDOW - 1} (0: the default), not "
                           f"{rows} x {cols}.")
    return command, rank, pty, rows, cols


async def _ready(fd: int, write: bool = False) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    add(fd, wake)
    try:
        await ready
    finally:
        remove(fd)


async def _pump(ws: WebSocket, fd: int, channel: int) -> None:
    """Send what `fd` gives until its end (EOF, or EIO: a pty with no process left on it)."""
    while True:
        await _ready(fd)
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            continue
        except OSError:
            return
        if not data:
            return
        await ws.send_bytes(bytes([channel]) + data)


async def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            await _ready(fd, write=True)


async def _exited(session: Any) -> int:
    """The command's exit code: its pidfd turns readable when it ends, so no thread waits meanwhile
    (the exit status itself is then read at once)."""
    if session.pidfd >= 0:
        await _ready(session.pidfd)
    code: int = await asyncio.to_thread(session.wait)
    return code


async def _feed(ws: WebSocket, session: Any) -> None:
    """Client frames to the exec, one at a time (the next is received once this one is written)."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        data = message.get("bytes")
        if not data:
            continue
        channel, body = data[0], data[1:]
        if channel == STDIN and session.stdin >= 0:
            with contextlib.suppress(BrokenPipeError):  # the command stopped reading: drop it
                await _write_all(session.stdin, body)
        elif channel == STDIN_EOF:
            session.close_stdin()
        elif channel in (RESIZE, SIGNAL):
            with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError, OverflowError):
                value = json.loads(body)
                if channel == RESIZE:
                    session.resize(int(value["rows"]), int(value["cols"]))
                elif int(value["signal"]) in SIGNALS:
                    session.signal(int(value["signal"]))


@router.websocket("/{workload_id}/exec")
async def exec_stream(ws: WebSocket, workload_id: str) -> None:
    rt: Runtime = ws.app.state.runtime
    await ws.accept()
    session = None
    release = None
    try:
        try:
            client = ws.client
            who = rt.auth.principal(ws.headers.get("authorization"), remote=client.host if client else "",
                                    route=("GET", ws.url.path))
            release = rt.tenant_rates.admit(who)
            try:
                first = await asyncio.wait_for(ws.receive(), FIRST_MESSAGE_S)
            except TimeoutError:
                raise InvalidInput(f"No command came within {FIRST_MESSAGE_S:.0f} s of the connection; "
                                   "send it first.") from None
            if first["type"] == "websocket.disconnect":
                return
            command, rank, pty, rows, cols = _request(first.get("text") or "")
            node, pod_id = await asyncio.to_thread(live_pod, rt, who.tenant, workload_id, rank)
            try:
                session = await asyncio.to_thread(rt.provider.exec, node, pod_id, command, pty=pty, rows=rows,
                                                  cols=cols)
            except OSError as exc:  # out of descriptors or ptys on the node: said, not a dropped stream
                raise ProviderError(f"Could not start the command inside pod {pod_id} ({exc.strerror}); "
                                    "try again when the node has fewer execs open.") from None
        except GpupoolError as exc:
            await ws.send_text(json.dumps({"error": exc.message, "status": exc.http_status}))
            await ws.close()
            return
        await ws.send_text(json.dumps({"started": pod_id}))
        outputs = [asyncio.create_task(_pump(ws, session.stdout, STDOUT))]
        if session.stderr >= 0:
            outputs.append(asyncio.create_task(_pump(ws, session.stderr, STDERR)))
        feeding = asyncio.create_task(_feed(ws, session))
        waiting = asyncio.create_task(_exited(session))
        await asyncio.wait({feeding, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done():  # the client went away: the exec goes too
            session.signal(signal.SIGKILL)
            for task in outputs:
                task.cancel()
            await asyncio.gather(*outputs, feeding, return_exceptions=True)
            return
        code = waiting.result()
        await asyncio.wait(outputs, timeout=DRAIN_AFTER_EXIT_S)
        for task in (*outputs, feeding):
            task.cancel()
        await asyncio.gather(*outputs, feeding, return_exceptions=True)
        await ws.send_text(json.dumps({"exit_code": code}))
        await ws.close()
    except WebSocketDisconnect:
        pass
    finally:
        if release is not None:
            release()
        if session is not None:
            session.close()
