"""The sandbox HTTP service's defences against clients that hold connections without finishing requests.

- Header timeout: aiohttp's keep-alive timer runs from a connection's start, and from each answer,
  until the next request's headers are complete; past it aiohttp closes the connection. `serve`
  (sandbox.server) sets that timer to `header_timeout_s`.
- Body timeout: `read_body` gives a request's body `body_timeout_s` to arrive, else answers 408.
- Connection cap: `GuardedSite` puts `ConnectionGuard` between the listening socket and aiohttp. At
  `max_connections`, a new connection displaces the oldest one with no request in service (one
  whose client never finished its request, or an idle keep-alive connection); when every
  connection has a request in service, the new one is answered 503 and closed.
- Rate-limited logs: `RateLimitedLog` lets a repeated message through once per interval, saying
  how many like it it held back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 1024
# Longer than aiohttp clients keep an idle connection (15 s), so that they never reuse one the
# server is closing.
DEFAULT_HEADER_TIMEOUT_S = 20.0
DEFAULT_BODY_TIMEOUT_S = 60.0
LINGERING_S = 2.0  # after answering a request whose body was not read, drop the rest this long
BUSY_ANSWER_WAIT_S = 1.0  # a refused connection waits this long for its request before it is closed
FD_RESERVE = 64  # descriptors kept for the listening socket, logs, the backend's own files
FDS_PER_RUN = 16  # pipes, status pipes, lock files, sockets of one run in flight
BUSY_ANSWER = json.dumps(
    {"error": "busy", "message": "every connection has a request in service; retry later", "retry_after_s": 1}
).encode()
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(BUSY_ANSWER), BUSY_ANSWER)
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def max_connections_allowed(max_concurrency: int) -> int:
    """How many connections fit the descriptors this process may open, beside `max_concurrency` runs."""
    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft_limit == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return soft_limit - FD_RESERVE - FDS_PER_RUN * max_concurrency


class ConnectionGuard:
    """The connection limits of one app, the connections it has open and those it dropped or refused."""

    def __init__(self, max_connections: int, header_timeout_s: float, body_timeout_s: float) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        for name, value in (("header_timeout_s", header_timeout_s), ("body_timeout_s", body_timeout_s)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.num_dropped = 0  # connections displaced at the cap, their requests unfinished
        self.num_refused = 0  # connections answered 503 at the cap
        self._open: dict[_TrackedConnection, None] = {}  # oldest first
        self._in_service: set[RequestHandler] = set()
        self._num_answering_busy = 0

    @property
    def num_open(self) -> int:
        return len(self._open)

    def protocol_factory(self, server: web.Server) -> Callable[[], asyncio.Protocol]:
        """What the listening socket calls for each new connection, in place of aiohttp's `server`."""

        def accept() -> asyncio.Protocol:
            if len(self._open) >= self.max_connections and not self._drop_oldest_idle():
                self.num_refused += 1
                logger.warning(
                    "at the cap of %d connections, all in service: answered 503", self.max_connections
                )
                return _BusyAnswer(self)
            connection = _TrackedConnection(self, server())
            self._open[connection] = None
            return connection

        return accept

    def _drop_oldest_idle(self) -> bool:
        for connection in self._open:
            if connection.handler not in self._in_service:
                del self._open[connection]
                connection.drop()
                self.num_dropped += 1
                logger.warning(
                    "at the cap of %d connections: dropped the oldest without a request in service",
                    self.max_connections,
                )
                return True
        return False

    def middleware(self) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
        """Marks a request in service (its connection is never dropped) once it has been read whole."""

        @web.middleware
        async def mark_in_service(request: web.Request, handler: Handler) -> web.StreamResponse:
            if not request.body_exists:
                self._in_service.add(request.protocol)
            try:
                return await handler(request)
            finally:
                self._in_service.discard(request.protocol)

        return mark_in_service

    async def read_body(self, request: web.Request) -> bytes:
        """The request's body, if it arrives within `body_timeout_s`; otherwise HTTP 408."""
        try:
            async with asyncio.timeout(self.body_timeout_s):
                body = await request.read()
        except TimeoutError:
            message = f"the request body did not arrive within {self.body_timeout_s:g} s"
            answer = web.HTTPRequestTimeout(
                text=json.dumps({"error": "request timeout", "message": message}),
                content_type="application/json",
            )
            answer.force_close()
            raise answer from None
        self._in_service.add(request.protocol)
        return body


class _TrackedConnection(asyncio.Protocol):
    """aiohttp's handler of one connection, passed through, so that the guard sees it close."""

    def __init__(self, guard: ConnectionGuard, handler: RequestHandler) -> None:
        self._guard = guard
        self.handler = handler
        self._dropped = False
        self._made = False  # asyncio accepts a batch of connections before it starts any of them

    def drop(self) -> None:
        """Close the connection, whatever its request has sent so far."""
        self._dropped = True
        if self._made:
            self.handler.force_close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._dropped:  # displaced before it started: aiohttp never sees it
            transport.close()
            return
        self._made = True
        self.handler.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard._open.pop(self, None)
        if self._made:
            self.handler.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self.handler.eof_received()

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()


class _BusyAnswer(asyncio.Protocol):
    """A connection over the cap: its request is answered 503; one that sends none is closed soon."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard
        self._transport: asyncio.Transport | None = None
        self._closer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if self._guard._num_answering_busy >= self._guard.max_connections:  # a flood: no waiting
            transport.close()
            return
        self._guard._num_answering_busy += 1
        self._closer = asyncio.get_running_loop().call_later(BUSY_ANSWER_WAIT_S, transport.close)

    def data_received(self, data: bytes) -> None:
        # Answered once some of the request is read, so that closing does not reset the connection
        # before the client reads the answer.
        assert self._transport is not None
        if not self._transport.is_closing():
            self._transport.write(BUSY_RESPONSE)
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closer is not None:
            self._closer.cancel()
            self._guard._num_answering_busy -= 1


class GuardedSite(web.BaseSite):
    """A TCP site whose connections go through a `ConnectionGuard`."""

    __slots__ = ("_guard", "_host", "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard) -> None:
        super().__init__(runner)
        self._host, self._port, self._guard = host, port, guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        """The bound port (the asked one before `start`)."""
        if self._server is None:
            return self._port
        return self._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.protocol_factory(server), self._host, self._port, backlog=self._backlog
        )


class RateLimitedLog(logging.Filter):
    """A handler filter: a message (by logger, level and first line) passes once per `interval_s`; the
    next one to pass after the interval says how many like it were held back meanwhile."""

    def __init__(self, interval_s: float = 10.0, max_messages: int = 1024) -> None:
        super().__init__()
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self._max_messages = max_messages
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}  # key -> (passed at, held back since)

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg).split("\n", 1)[0][:200])
        now = time.monotonic()
        passed_at, held_back = self._seen.get(key, (-float("inf"), 0))
        if now - passed_at < self.interval_s:
            self._seen[key] = (passed_at, held_back + 1)
            return False
        if len(self._seen) >= self._max_messages:  # forget the quiet ones; the memory stays bounded
            self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.interval_s}
        self._seen[key] = (now, 0)
        if held_back:
            held_back_for_s = now - passed_at
            record.msg = (
                f"{record.getMessage()} [{held_back} more like this in the last {held_back_for_s:.0f} s]"
            )
            record.args = None
        return True
