"""The sandbox service's session routes: one jail per episode, driven over HTTP.

    POST   /v1/sessions                   {}                          -> {"session_id"}
    POST   /v1/sessions/{id}/exec         {"command", "timeout_s"}    -> ExecResult
    PUT    /v1/sessions/{id}/files        {"path", "data_b64"}        -> {}
    GET    /v1/sessions/{id}/files?path=P                             -> {"data_b64", "truncated", "exists"}
    POST   /v1/sessions/{id}/reset                                    -> {}
    DELETE /v1/sessions/{id}                                          -> {}

Registered by `sandbox.server.create_app` on the app of one executor; the sessions run on the
same kind of backend in a `SessionPool` of their own, started at the first session. Deadlines and
busy answers work as for `/v1/run`: a create that cannot get a session within the request's
deadline (`X-Sandbox-Deadline-S`), and a command sent to a session that is still running one,
are answered 503 with Retry-After; a command whose timeout exceeds the deadline is a 400. A
session whose client vanished is closed by the pool when its time-to-live passes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandbox.server import ServerBusy, _bad_request, _bad_request_message, _busy_response, request_deadline_s
from sandbox.sessions.jail import JailBackedSession
from sandbox.sessions.pool import SessionPool, SessionPoolSettings
from sandbox.sessions.types import SessionFailure


@dataclasses.dataclass
class _Sessions:
    """The app's session pool, started by the first create (an app's state is fixed once it runs)."""

    settings: SessionPoolSettings | None  # None: the backend cannot hold sessions
    starting: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    pool: SessionPool | None = None


_sessions_key = web.AppKey("sessions", _Sessions)
SESSION_BACKENDS = ("docker", "bwrap")
BUSY_RETRY_S = 1.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExecBody(_Strict):
    command: str = Field(min_length=1)
    timeout_s: float | None = Field(default=None, gt=0)


class WriteBody(_Strict):
    path: str = Field(min_length=1)
    data_b64: str


def add_session_routes(
    app: web.Application, backend_name: str, settings: SessionPoolSettings | None = None
) -> None:
    """Register the session routes; sessions use `backend_name` (the executor's backend)."""
    if backend_name in SESSION_BACKENDS:
        settings = settings or SessionPoolSettings(backend=backend_name, num_warm=0)
    app[_sessions_key] = _Sessions(settings if backend_name in SESSION_BACKENDS else None)
    app.router.add_post("/v1/sessions", handle_create)
    app.router.add_post("/v1/sessions/{session_id}/exec", handle_exec)
    app.router.add_put("/v1/sessions/{session_id}/files", handle_write)
    app.router.add_get("/v1/sessions/{session_id}/files", handle_read)
    app.router.add_post("/v1/sessions/{session_id}/reset", handle_reset)
    app.router.add_delete("/v1/sessions/{session_id}", handle_close)
    app.on_cleanup.append(_close_pool)


async def _close_pool(app: web.Application) -> None:
    pool = app[_sessions_key].pool
    if pool is not None:
        await pool.close()


async def _pool(app: web.Application) -> SessionPool:
    sessions = app[_sessions_key]
    if sessions.settings is None:
        raise web.HTTPBadRequest(reason="sessions need the docker or bwrap backend")
    async with sessions.starting:
        if sessions.pool is None:
            try:
                sessions.pool = await SessionPool.create(sessions.settings)
            except Exception as error:
                raise web.HTTPInternalServerError(
                    reason=f"the session pool could not start: {error}"
                ) from error
    return sessions.pool


def _session(request: web.Request) -> JailBackedSession:
    pool = request.app[_sessions_key].pool
    session = pool.session(request.match_info["session_id"]) if pool is not None else None
    if session is None:
        raise web.HTTPNotFound(
            text='{"error": "not found", "message": "no such session (closed, expired or never made)"}',
            content_type="application/json",
        )
    return session


def _failure(error: SessionFailure) -> web.Response:
    return web.json_response({"error": "sandbox error", "message": str(error)}, status=500)


async def handle_create(request: web.Request) -> web.Response:
    try:
        deadline_s = request_deadline_s(request)
    except ValueError as error:
        return _bad_request_message(str(error))
    pool = await _pool(request.app)
    try:
        async with asyncio.timeout(deadline_s):
            session = await pool.acquire()
    except TimeoutError:
        return _busy_response(
            ServerBusy(BUSY_RETRY_S, f"no session free within the {deadline_s:g} s deadline")
        )
    except SessionFailure as error:
        return _failure(error)
    return web.json_response({"session_id": session.session_id})


async def handle_exec(request: web.Request) -> web.Response:
    session = _session(request)
    try:
        body = ExecBody.model_validate_json(await request.read())
        deadline_s = request_deadline_s(request)
        timeout_s = session.limits.timeout_s(body.timeout_s)
    except ValidationError as error:
        return _bad_request(error)
    except ValueError as error:
        return _bad_request_message(str(error))
    if timeout_s > deadline_s:
        return _bad_request_message(
            f"the command's timeout of {timeout_s:g} s is longer than the request's {deadline_s:g} s deadline; "
            "raise the deadline or shorten the timeout"
        )
    if session.busy:
        return _busy_response(ServerBusy(BUSY_RETRY_S, "the session is running another command"))
    try:
        result = await session.exec(body.command, timeout_s)
    except SessionFailure as error:
        return _failure(error)
    return web.json_response(dataclasses.asdict(result))


async def handle_write(request: web.Request) -> web.Response:
    session = _session(request)
    try:
        body = WriteBody.model_validate_json(await request.read())
        data = base64.b64decode(body.data_b64, validate=True)
    except ValidationError as error:
        return _bad_request(error)
    except (ValueError, binascii.Error) as error:
        return _bad_request_message(f"data_b64 is not base64: {error}")
    try:
        await session.write_file(body.path, data)
    except SessionFailure as error:
        return _failure(error)
    except (OSError, ValueError) as error:
        return _bad_request_message(str(error))
    return web.json_response({})


async def handle_read(request: web.Request) -> web.Response:
    session = _session(request)
    path = request.query.get("path")
    if not path:
        return _bad_request_message("give the file as the query parameter ?path=...")
    try:
        content = await session.read_file(path)
    except SessionFailure as error:
        return _failure(error)
    return web.json_response(
        {
            "data_b64": base64.b64encode(content.data).decode(),
            "truncated": content.truncated,
            "exists": content.exists,
        }
    )


async def handle_reset(request: web.Request) -> web.Response:
    session = _session(request)
    try:
        await session.reset()
    except SessionFailure as error:
        return _failure(error)
    return web.json_response({})


async def handle_close(request: web.Request) -> web.Response:
    session = _session(request)
    try:
        await session.close()
    except SessionFailure as error:
        return _failure(error)
    return web.json_response({})
