"""The sandbox as an HTTP service: an aiohttp front for one `Executor`.

    python -m sandbox.server --backend auto --host 127.0.0.1 --port 8090 [--token T] [--max-concurrency N]

Endpoints: `POST /v1/run` (RunRequest -> RunResponse), `POST /v1/run_batch` ({requests} ->
{responses}, run concurrently as the executor admits them), `GET /health`, `GET /metrics`,
SandboxFusion's `POST /run_code` (see sandbox.sandboxfusion) plus its `GET /v1/ping`, and the
stateful session routes under `/v1/sessions` (see sandbox.session_routes).

Security: binds 127.0.0.1 by default and refuses a non-loopback address without a bearer token
(--token or $AGENTRL_SANDBOX_TOKEN); with a token, every endpoint but /health requires
`Authorization: Bearer <token>`. Request bodies are size-limited, and a request's limits (time,
memory, output) are capped by the server (`RequestCaps`; above a cap: 400, or 422 on /run_code,
naming the field, its value and the cap). Connections are capped, and headers and bodies must
arrive in time (sandbox.http_guard). Stopping the server closes the executor and with it the
backend (containers, jails).
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
import resource
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field, ValidationError

from sandbox import sandboxfusion
from sandbox.admission import AdmissionTimeout
from sandbox.executor import Executor
from sandbox.http_guard import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    LINGERING_S,
    ConnectionGuard,
    GuardedSite,
    RateLimitedLog,
    max_connections_allowed,
)
from sandbox.judge import COMPILE_LIMITS, run_limits, validate_request, wall_clock_s
from sandbox.metrics import ConnectionCounts, ServerMetrics
from sandbox.types import RunLimits, RunRequest, RunResponse, Verdict

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

DEFAULT_MAX_TIME_S = 60.0
DEFAULT_MAX_MEMORY_MB = 4096
DEFAULT_MAX_OUTPUT_BYTES = 8 << 20
DEFAULT_LOG_INTERVAL_S = 10.0


@dataclasses.dataclass(frozen=True)
class RequestCaps:
    """The most one request may ask for. Output is held in the server's memory while it is judged
    and answered, so its cap bounds what one request costs the server; time and memory bound what
    one run takes from the others."""

    max_time_s: float = DEFAULT_MAX_TIME_S
    max_memory_mb: int = DEFAULT_MAX_MEMORY_MB
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES

    def __post_init__(self) -> None:
        for name in ("max_time_s", "max_memory_mb", "max_output_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def violations(self, limits: RunLimits) -> list[OverCap]:
        """Every limit above its cap."""
        caps = (
            OverCap("time_s", limits.time_s, self.max_time_s, "--max-time-s"),
            OverCap("wall_time_s", limits.wall_time_s or 0.0, wall_clock_s(self.max_time_s), "--max-time-s"),
            OverCap("memory_mb", limits.memory_mb, self.max_memory_mb, "--max-memory-mb"),
            OverCap("max_output_bytes", limits.max_output_bytes, self.max_output_bytes, "--max-output-mb"),
        )
        return [cap for cap in caps if cap.asked > cap.maximum]


@dataclasses.dataclass(frozen=True)
class OverCap:
    """A limit of a request (a field of RunLimits) above the server's cap for it."""

    field: str
    asked: float
    maximum: float
    option: str  # the server option that sets the cap

    def message(self, name: str) -> str:
        """The error, with the field called `name` (its place in the request)."""
        return (
            f"{name} is {_number(self.asked)}, above this server's maximum of {_number(self.maximum)} "
            f"({self.option})"
        )


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


_executor_key = web.AppKey("executor", Executor)
_metrics_key = web.AppKey("metrics", ServerMetrics)
_default_deadline_key = web.AppKey("default_deadline_s", float)
_caps_key = web.AppKey("caps", RequestCaps)
_guard_key = web.AppKey("guard", ConnectionGuard)


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


def _max_wait_s(requests: Sequence[RunRequest], deadline_s: float) -> float:
    """How long runs may wait to start and still finish before the client gives up: the deadline
    less the longest wall clock of one of their processes."""
    return max(0.0, deadline_s - max(run_limits(request).wall_time_s for request in requests))


def _check_capacity(app: web.Application, requests: Sequence[RunRequest], deadline_s: float) -> None:
    """Refuse at once work that the queue ahead of it would keep waiting past its deadline."""
    wait_s = app[_executor_key].admission.estimated_wait_s(len(requests))
    max_wait_s = _max_wait_s(requests, deadline_s)
    if wait_s > max_wait_s:
        raise ServerBusy(
            wait_s,
            f"the queue ahead would take about {wait_s:.1f} s; to finish within the {deadline_s:g} s "
            f"deadline a run may wait {max_wait_s:.1f} s",
        )


async def _run_one(app: web.Application, request: RunRequest, deadline_s: float) -> RunResponse:
    """Run `request` once the executor admits it in time to finish before its deadline; raise
    ServerBusy if it cannot.

    If the client goes away meanwhile, aiohttp cancels this task: the request leaves the queue, or
    its jail is killed (the executor releases every session in `finally`).
    """
    executor = app[_executor_key]
    arrived = time.monotonic()
    max_wait_s = _max_wait_s([request], deadline_s)
    try:
        response = await executor.run(request, max_wait_s=max_wait_s)
    except AdmissionTimeout:
        raise ServerBusy(
            max(1.0, executor.admission.estimated_wait_s()),
            f"no room to start within {max_wait_s:.1f} s, as it must to finish within the "
            f"{deadline_s:g} s deadline",
        ) from None
    except Exception as error:  # the executor promises not to raise; if it does, it is our failure
        logger.exception("executor raised")
        response = RunResponse(
            verdict=Verdict.SANDBOX_ERROR, sandbox_error=f"sandbox server error: {error!r}"
        )
    app[_metrics_key].record(response.verdict, time.monotonic() - arrived)
    return response


def _check_caps(app: web.Application, request: RunRequest, location: list[str | int]) -> None:
    """Raise _OverCaps naming every limit of `request` above the server's caps."""
    violations = app[_caps_key].violations(request.limits)
    if violations:
        raise _OverCaps([[*location, "limits", cap.field] for cap in violations], violations)


class _OverCaps(ValueError):
    """Limits of a request above the server's caps, with where each is in the request."""

    def __init__(self, locations: list[list[str | int]], caps: list[OverCap]) -> None:
        self.messages = [
            cap.message(".".join(map(str, loc))) for loc, cap in zip(locations, caps, strict=True)
        ]
        self.locations = locations
        super().__init__("; ".join(self.messages))

    def detail(self) -> list[dict[str, Any]]:
        return [
            {"loc": loc, "msg": message, "type": "value_error"}
            for loc, message in zip(self.locations, self.messages, strict=True)
        ]


async def handle_run(request: web.Request) -> web.Response:
    try:
        run_request = RunRequest.model_validate_json(await request.app[_guard_key].read_body(request))
        validate_request(run_request)
        _check_caps(request.app, run_request, [])
        deadline_s = request_deadline_s(request)
    except ValidationError as error:
        return _bad_request(error)
    except _OverCaps as over:
        return _bad_request_message(str(over), over.detail())
    except ValueError as error:  # well-formed but impossible, e.g. a call test for C++
        return _bad_request_message(str(error))
    try:
        _check_capacity(request.app, [run_request], deadline_s)
        return _json_response(await _run_one(request.app, run_request, deadline_s))
    except ServerBusy as busy:
        return _busy_response(busy)


async def handle_run_batch(request: web.Request) -> web.Response:
    try:
        batch = BatchRequest.model_validate_json(await request.app[_guard_key].read_body(request))
        deadline_s = request_deadline_s(request)
    except ValidationError as error:
        return _bad_request(error)
    except ValueError as error:
        return _bad_request_message(str(error))
    for index, item in enumerate(batch.requests):
        try:
            validate_request(item)
            _check_caps(request.app, item, ["requests", index])
        except _OverCaps as over:
            return _bad_request_message(str(over), over.detail())
        except ValueError as error:
            return _bad_request_message(f"requests.{index}: {error}")
    if not batch.requests:
        return _json_response(BatchResponse(responses=[]))
    try:
        _check_capacity(request.app, batch.requests, deadline_s)
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
        fusion_request = sandboxfusion.RunCodeRequest.model_validate_json(
            await request.app[_guard_key].read_body(request)
        )
        deadline_s = request_deadline_s(request)
    except ValidationError as error:
        return web.json_response(sandboxfusion.validation_error_body(error), status=422)
    except ValueError as error:
        return _bad_request_message(str(error))
    caps = request.app[_caps_key]
    no_limit_memory_mb = min(sandboxfusion.NO_LIMIT_MEMORY_MB, caps.max_memory_mb)
    run_request = sandboxfusion.to_run_request(fusion_request, no_limit_memory_mb)
    over_caps: dict[str, str] = {}
    for cap in caps.violations(run_request.limits):
        field = sandboxfusion.FIELD_OF_LIMIT[cap.field]  # time_s and wall_time_s are both run_timeout
        over_caps.setdefault(field, cap.message(field))
    if over_caps:
        return web.json_response(sandboxfusion.limit_error_body(over_caps), status=422)
    try:
        _check_capacity(request.app, [run_request], deadline_s)
        response = await _run_one(request.app, run_request, deadline_s)
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
    executor, guard = request.app[_executor_key], request.app[_guard_key]
    connections = ConnectionCounts(
        num_open=guard.num_open,
        max_connections=guard.max_connections,
        num_dropped=guard.num_dropped,
        num_refused=guard.num_refused,
    )
    snapshot = request.app[_metrics_key].snapshot(
        executor.admission.state(), connections, backend_stats=_backend_stats(executor)
    )
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
    caps: RequestCaps = RequestCaps(),
    max_connections: int | None = None,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
) -> web.Application:
    """The service around `executor`; the app owns it and closes it on shutdown.

    Runs start as the executor's admission allows (by CPU, memory and a concurrency bound), so
    `/metrics` sees the queue. A request that cannot start in time to finish within its deadline
    (`X-Sandbox-Deadline-S`, else `default_deadline_s`) is answered 503 with Retry-After, at once
    when the queue is clearly too long. `max_connections` (default: 1024, fewer where the
    descriptor limit says so), `header_timeout_s` and `body_timeout_s` apply when the app is served
    with `serve`, which also drops the work of a client that disconnected.
    """
    if token is not None and not token:
        raise ValueError("token must be a non-empty string or None")
    if not default_deadline_s > 0:
        raise ValueError(f"default_deadline_s must be > 0, got {default_deadline_s}")
    budget_mb = executor.admission.memory_budget_mb
    if max(caps.max_memory_mb, COMPILE_LIMITS.memory_mb) > budget_mb:
        raise ValueError(
            f"a run may take {max(caps.max_memory_mb, COMPILE_LIMITS.memory_mb)} MB (the maximum memory, or "
            f"the compiler's), more than the memory budget of {budget_mb} MB: no such run could ever start"
        )
    allowed = max_connections_allowed(executor.max_concurrency)
    if max_connections is None:
        max_connections = min(DEFAULT_MAX_CONNECTIONS, allowed)
    if max_connections > allowed:
        raise ValueError(
            f"max_connections {max_connections} needs more file descriptors than this process may open "
            f"beside {executor.max_concurrency} runs (at most {max(allowed, 0)} connections); "
            "raise `ulimit -n` or lower it"
        )
    guard = ConnectionGuard(max_connections, header_timeout_s, body_timeout_s)
    middlewares = [guard.middleware()] + ([_auth_middleware(token)] if token is not None else [])
    app = web.Application(client_max_size=max_body_bytes, middlewares=middlewares)
    app[_executor_key] = executor
    app[_metrics_key] = ServerMetrics()
    app[_default_deadline_key] = default_deadline_s
    app[_caps_key] = caps
    app[_guard_key] = guard
    app.router.add_post("/v1/run", handle_run)
    app.router.add_post("/v1/run_batch", handle_run_batch)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_post("/run_code", handle_run_code)
    app.router.add_get("/v1/ping", handle_ping)
    from sandbox.session_routes import add_session_routes  # it imports this module's helpers

    add_session_routes(app, executor.backend.name)

    async def close_executor(app: web.Application) -> None:
        await app[_executor_key].close()
        logger.info("sandbox backend %s closed", app[_executor_key].backend.name)

    app.on_cleanup.append(close_executor)
    return app


@asynccontextmanager
async def serve(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve `app` while inside the block; yields its base URL (port 0 picks a free port).

    An app of `create_app` is served behind its connection guard; any other aiohttp app plainly.
    """
    guard = app.get(_guard_key)
    options: dict[str, Any] = {"access_log": None, "handler_cancellation": True}
    if guard is not None:
        # aiohttp's keep-alive timer runs until a request's headers are complete: the header timeout
        options |= {"keepalive_timeout": guard.header_timeout_s, "lingering_time": LINGERING_S}
    runner = web.AppRunner(app, **options)
    await runner.setup()
    try:
        site: GuardedSite | web.TCPSite = (
            GuardedSite(runner, host, port, guard) if guard is not None else web.TCPSite(runner, host, port)
        )
        await site.start()
        yield f"http://{host}:{site.port}"
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
        help="runs in flight at once, sleeping ones included (default: 8 per CPU core, at most the "
        "backend's jails; one per core with docker where its containers' cgroups cannot be read)",
    )  # fmt: skip
    parser.add_argument(
        "--cpu-slots", type=int, default=None,
        help="runs always admitted; beyond them a run starts only while the others leave a core idle "
        "(default: one per CPU core)",
    )  # fmt: skip
    parser.add_argument(
        "--memory-budget-mb", type=int, default=None,
        help="the memory limits of the runs in flight add up to at most this (default: the machine's memory)",
    )  # fmt: skip
    parser.add_argument(
        "--default-deadline-s", type=float, default=DEFAULT_DEADLINE_S,
        help=f"how long a client without the {DEADLINE_HEADER} header waits for its answer; a run that "
        "cannot start in time to finish by then is answered 503",
    )  # fmt: skip
    parser.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / (1 << 20))
    parser.add_argument(
        "--max-time-s", type=float, default=DEFAULT_MAX_TIME_S, help="most a request's time_s may be"
    )
    parser.add_argument(
        "--max-memory-mb", type=int, default=DEFAULT_MAX_MEMORY_MB, help="most a request's memory_mb may be"
    )
    parser.add_argument(
        "--max-output-mb", type=float, default=DEFAULT_MAX_OUTPUT_BYTES / (1 << 20),
        help="most a request's max_output_bytes may be, in MiB",
    )  # fmt: skip
    parser.add_argument(
        "--max-connections", type=int, default=None,
        help=f"connections open at once (default: {DEFAULT_MAX_CONNECTIONS}, fewer if `ulimit -n` is low)",
    )  # fmt: skip
    parser.add_argument(
        "--header-timeout-s", type=float, default=DEFAULT_HEADER_TIMEOUT_S,
        help="a connection must send a request's headers within this (from its start or its last answer)",
    )  # fmt: skip
    parser.add_argument("--body-timeout-s", type=float, default=DEFAULT_BODY_TIMEOUT_S)
    parser.add_argument(
        "--log-interval-s", type=float, default=DEFAULT_LOG_INTERVAL_S,
        help="a repeated log message is written once per interval, with the count of those held back",
    )  # fmt: skip
    return parser.parse_args(argv)


def _raise_descriptor_limit() -> None:
    """Raise the soft limit on open files to the hard one: every connection and run holds some."""
    soft_limit, hard_limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft_limit != hard_limit:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard_limit, hard_limit))
        except (ValueError, OSError) as error:
            logger.warning(
                "could not raise the open-file limit from %d to %d: %s", soft_limit, hard_limit, error
            )


async def _serve_until_stopped(args: argparse.Namespace, token: str | None) -> None:
    executor = await Executor.create(
        backend=args.backend,
        max_concurrency=args.max_concurrency,
        cpu_slots=args.cpu_slots,
        memory_budget_mb=args.memory_budget_mb,
    )
    try:
        app = create_app(
            executor,
            token=token,
            max_body_bytes=int(args.max_body_mb * (1 << 20)),
            default_deadline_s=args.default_deadline_s,
            caps=RequestCaps(args.max_time_s, args.max_memory_mb, int(args.max_output_mb * (1 << 20))),
            max_connections=args.max_connections,
            header_timeout_s=args.header_timeout_s,
            body_timeout_s=args.body_timeout_s,
        )
    except ValueError:
        await executor.close()
        raise
    state = executor.admission.state()
    logger.info(
        "sandbox backend %s: %d runs in flight at most, %d CPU slots, memory budget %d MB",
        executor.backend.name, state.max_concurrency, state.cpu_slots, state.memory_budget_mb,
    )  # fmt: skip
    stop = asyncio.Event()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signal_number, stop.set)
    async with serve(app, args.host, args.port) as url:
        logger.info("serving on %s", url)
        await stop.wait()


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
    for handler in logging.getLogger().handlers:
        handler.addFilter(RateLimitedLog(args.log_interval_s))
    _raise_descriptor_limit()
    try:
        asyncio.run(_serve_until_stopped(args, token))
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main()
