"""The sandbox as an HTTP service: an aiohttp front for one `Executor`.

    python -m sandbox.server --backend auto --host 127.0.0.1 --port 8090 [--token T] [--max-concurrency N]

Endpoints: `POST /v1/run` (RunRequest -> RunResponse), `POST /v1/run_batch` ({requests} ->
{responses}, run concurrently up to the concurrency bound), `GET /health`, `GET /metrics`, and
SandboxFusion's `POST /run_code` (see sandbox.sandboxfusion) plus its `GET /v1/ping`.

Security: binds 127.0.0.1 by default and refuses a non-loopback address without a bearer token
(--token or $AGENTRL_SANDBOX_TOKEN); with a token, every endpoint but /health requires
`Authorization: Bearer <token>`. Request bodies are size-limited. Stopping the server closes the
executor and with it the backend (containers, jails).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hmac
import ipaddress
import json
import logging
import math
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field, ValidationError

from sandbox import sandboxfusion
from sandbox.executor import Executor
from sandbox.judge import validate_request
from sandbox.metrics import ServerMetrics
from sandbox.types import RunRequest, RunResponse, Verdict

logger = logging.getLogger(__name__)

TOKEN_ENV_VAR = "AGENTRL_SANDBOX_TOKEN"
DEFAULT_MAX_BODY_BYTES = 16 << 20
MAX_BATCH_SIZE = 4096
_UNAUTHENTICATED_PATHS = frozenset({"/health"})
DEADLINE_HEADER = "X-Sandbox-Deadline-S"
# Without the header, a request is worth waiting for as long as a typical HTTP client's read
# timeout: past it, its client has given up (SandboxFusion clients use 30 s or more).
DEFAULT_DEADLINE_S = 30.0
MAX_RETRY_AFTER_S = 60.0

_executor_key = web.AppKey("executor", Executor)
_metrics_key = web.AppKey("metrics", ServerMetrics)
_default_deadline_key = web.AppKey("default_deadline_s", float)


class BatchRequest(BaseModel):
    """Body of `POST /v1/run_batch`."""

    requests: list[RunRequest] = Field(max_length=MAX_BATCH_SIZE)


class BatchResponse(BaseModel):
    """Answer of `POST /v1/run_batch`, in request order."""

    responses: list[RunResponse]


def is_loopback_host(host: str) -> bool:
    """True when every address `host` resolves to is a loopback address."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as error:
        raise ValueError(f"cannot resolve host {host!r}: {error}") from error
    return all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def check_bind_allowed(host: str, token: str | None) -> None:
    """Refuse to expose an unauthenticated code-execution service beyond this machine."""
    if token is None and not is_loopback_host(host):
        raise ValueError(
            f"refusing to bind non-loopback host {host!r} without a token: anyone who reaches it could "
            f"run code; pass --token or set ${TOKEN_ENV_VAR}, or bind 127.0.0.1"
        )


def _json_response(model: BaseModel, status: int = 200) -> web.Response:
    return web.Response(text=model.model_dump_json(), status=status, content_type="application/json")


def _bad_request(error: ValidationError) -> web.Response:
    # The offending input can be a whole program: leave it out. pydantic puts the exception object
    # in `ctx`; `default=str` renders it as text.
    errors = error.errors(include_url=False, include_input=False)
    detail = json.loads(json.dumps(errors, default=str))
    return _bad_request_message(str(error), detail)


def _bad_request_message(message: str, detail: list[Any] | None = None) -> web.Response:
    body = {"error": "invalid request", "message": message, "detail": detail or []}
    return web.json_response(body, status=400)


class ServerBusy(Exception):
    """The queue cannot start the work before its deadline: answered 503 with Retry-After."""

    def __init__(self, retry_after_s: float, reason: str) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


def request_deadline_s(request: web.Request) -> float:
    """Seconds the client will wait for this answer: its `X-Sandbox-Deadline-S`, else the server's default."""
    header = request.headers.get(DEADLINE_HEADER)
    if header is None:
        return request.app[_default_deadline_key]
    try:
        deadline_s = float(header)
    except ValueError:
        deadline_s = math.nan
    if not deadline_s > 0:
        raise ValueError(f"header {DEADLINE_HEADER} must be a positive number of seconds, got {header!r}")
    return deadline_s


def _busy_response(busy: ServerBusy) -> web.Response:
    retry_after = str(max(1, math.ceil(min(busy.retry_after_s, MAX_RETRY_AFTER_S))))
    body = {"error": "busy", "message": str(busy), "retry_after_s": int(retry_after)}
    return web.json_response(body, status=503, headers={"Retry-After": retry_after})


def _check_capacity(app: web.Application, num_requests: int, deadline_s: float) -> None:
    """Refuse at once work that the queue ahead of it would keep waiting past its deadline."""
    wait_s = app[_metrics_key].estimated_wait_s(num_requests)
    if wait_s > deadline_s:
        raise ServerBusy(
            wait_s, f"the queue ahead would take about {wait_s:.1f} s, past the {deadline_s:g} s deadline"
        )


async def _run_one(app: web.Application, request: RunRequest, deadline_s: float) -> RunResponse:
    """Run `request` once a slot frees up before its deadline; raise ServerBusy if none does.

    If the client goes away meanwhile, aiohttp cancels this task: the request leaves the queue, or
    its jail is killed (the executor releases every session in `finally`).
    """
    metrics = app[_metrics_key]
    try:
        async with metrics.admit(max_wait_s=deadline_s):
            response = await app[_executor_key].run(request)
    except TimeoutError:
        raise ServerBusy(
            deadline_s, f"no execution slot freed up within the {deadline_s:g} s deadline"
        ) from None
    except Exception as error:  # the executor promises not to raise; if it does, it is our failure
        logger.exception("executor raised")
        response = RunResponse(
            verdict=Verdict.SANDBOX_ERROR, sandbox_error=f"sandbox server error: {error!r}"
        )
    metrics.record_verdict(response.verdict)
    return response


async def handle_run(request: web.Request) -> web.Response:
    try:
        run_request = RunRequest.model_validate_json(await request.read())
        validate_request(run_request)
        deadline_s = request_deadline_s(request)
    except ValidationError as error:
        return _bad_request(error)
    except ValueError as error:  # well-formed but impossible, e.g. a call test for C++
        return _bad_request_message(str(error))
    try:
        _check_capacity(request.app, 1, deadline_s)
        return _json_response(await _run_one(request.app, run_request, deadline_s))
    except ServerBusy as busy:
        return _busy_response(busy)


async def handle_run_batch(request: web.Request) -> web.Response:
    try:
        batch = BatchRequest.model_validate_json(await request.read())
        deadline_s = request_deadline_s(request)
    except ValidationError as error:
        return _bad_request(error)
    except ValueError as error:
        return _bad_request_message(str(error))
    for index, item in enumerate(batch.requests):
        try:
            validate_request(item)
        except ValueError as error:
            return _bad_request_message(f"requests.{index}: {error}")
    try:
        _check_capacity(request.app, len(batch.requests), deadline_s)
    except ServerBusy as busy:
        return _busy_response(busy)

    async def run_or_report_busy(item: RunRequest) -> RunResponse:
        try:
            return await _run_one(request.app, item, deadline_s)
        except ServerBusy as busy:  # the rest of the batch ran: this one is retried alone
            return RunResponse(verdict=Verdict.SANDBOX_ERROR, sandbox_error=f"sandbox server busy: {busy}")

    responses = await asyncio.gather(*(run_or_report_busy(item) for item in batch.requests))
    return _json_response(BatchResponse(responses=list(responses)))


async def handle_run_code(request: web.Request) -> web.Response:
    try:
        fusion_request = sandboxfusion.RunCodeRequest.model_validate_json(await request.read())
        deadline_s = request_deadline_s(request)
    except ValidationError as error:
        return web.json_response(sandboxfusion.validation_error_body(error), status=422)
    except ValueError as error:
        return _bad_request_message(str(error))
    try:
        _check_capacity(request.app, 1, deadline_s)
        response = await _run_one(request.app, sandboxfusion.to_run_request(fusion_request), deadline_s)
    except ServerBusy as busy:
        return _busy_response(busy)
    return _json_response(sandboxfusion.from_run_response(response))


async def handle_ping(request: web.Request) -> web.Response:
    return web.json_response("pong")


async def handle_health(request: web.Request) -> web.Response:
    """200 when a jail can be had (or every slot is busy serving); 503 with the reason otherwise."""
    executor = request.app[_executor_key]
    reason = await executor.unhealthy_reason()
    if reason is not None:
        return web.json_response(
            {"status": "unhealthy", "backend": executor.backend.name, "reason": reason}, status=503
        )
    return web.json_response({"status": "ok", "backend": executor.backend.name})


async def handle_metrics(request: web.Request) -> web.Response:
    snapshot = request.app[_metrics_key].snapshot(backend_stats=_backend_stats(request.app[_executor_key]))
    return _json_response(snapshot)


def _backend_stats(executor: Executor) -> dict[str, int] | None:
    # A backend that keeps counters (the Docker pool: starts, recycles, host kills) exposes them as a
    # dataclass named `stats`; the others keep none.
    stats = getattr(executor.backend, "stats", None)
    return (
        dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) and not isinstance(stats, type) else None
    )


def _auth_middleware(token: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def require_token(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path not in _UNAUTHENTICATED_PATHS:
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return web.json_response(
                    {"error": "unauthorized", "message": "send the header 'Authorization: Bearer <token>'"},
                    status=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return await handler(request)

    return require_token


def create_app(
    executor: Executor,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    default_deadline_s: float = DEFAULT_DEADLINE_S,
) -> web.Application:
    """The service around `executor`; the app owns it and closes it on shutdown.

    Runs are admitted up to `executor.max_concurrency` at a time, so `/metrics` sees the queue.
    A request that cannot start within its deadline (`X-Sandbox-Deadline-S`, else
    `default_deadline_s`) is answered 503 with Retry-After, at once when the queue is clearly
    too long. Serve it with `handler_cancellation=True` (as `serve` and `main` do) so that work
    whose client disconnected is dropped.
    """
    if token is not None and not token:
        raise ValueError("token must be a non-empty string or None")
    if not default_deadline_s > 0:
        raise ValueError(f"default_deadline_s must be > 0, got {default_deadline_s}")
    middlewares = [_auth_middleware(token)] if token is not None else []
    app = web.Application(client_max_size=max_body_bytes, middlewares=middlewares)
    app[_executor_key] = executor
    app[_metrics_key] = ServerMetrics(executor.max_concurrency)
    app[_default_deadline_key] = default_deadline_s
    app.router.add_post("/v1/run", handle_run)
    app.router.add_post("/v1/run_batch", handle_run_batch)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_post("/run_code", handle_run_code)
    app.router.add_get("/v1/ping", handle_ping)

    async def close_executor(app: web.Application) -> None:
        await app[_executor_key].close()
        logger.info("sandbox backend %s closed", app[_executor_key].backend.name)

    app.on_cleanup.append(close_executor)
    return app


@asynccontextmanager
async def serve(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve `app` while inside the block; yields its base URL (port 0 picks a free port)."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"http://{host}:{bound_port}"
    finally:
        await runner.cleanup()


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sandbox.server", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="auto", choices=["auto", "docker", "bwrap", "unsafe-local"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--token", default=None, help=f"bearer token (default: ${TOKEN_ENV_VAR})")
    parser.add_argument(
        "--max-concurrency", type=int, default=None,
        help="programs run at once (default: one per CPU core; more only makes them share cores)",
    )  # fmt: skip
    parser.add_argument(
        "--default-deadline-s", type=float, default=DEFAULT_DEADLINE_S,
        help=f"how long a request without the {DEADLINE_HEADER} header may wait for a slot before 503",
    )  # fmt: skip
    parser.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / (1 << 20))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    token = args.token if args.token is not None else (os.environ.get(TOKEN_ENV_VAR) or None)
    if token == "":
        raise SystemExit("error: --token must not be empty")
    try:
        check_bind_allowed(args.host, token)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def build() -> web.Application:
        executor = await Executor.create(backend=args.backend, max_concurrency=args.max_concurrency)
        logger.info("sandbox backend %s, max concurrency %d", executor.backend.name, executor.max_concurrency)
        return create_app(
            executor,
            token=token,
            max_body_bytes=int(args.max_body_mb * (1 << 20)),
            default_deadline_s=args.default_deadline_s,
        )

    web.run_app(build(), host=args.host, port=args.port, access_log=None, handler_cancellation=True)


if __name__ == "__main__":
    main()
