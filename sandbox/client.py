"""Async client of the sandbox HTTP service, with the same `run`/`run_many` surface as `Executor`.

An env holds a `CodeRunner`: an in-process `Executor` or a `SandboxClient` pointed at a remote
`python -m sandbox.server`; both judge the same way and return the same `RunResponse`s.

Failure policy (the same as the executor's): a failure of the sandbox is a SANDBOX_ERROR response,
never an exception and never a program verdict.
- Retried, with exponential backoff and jitter: SANDBOX_ERROR responses, HTTP 5xx, HTTP 408 (the
  server gave up waiting for the request's body), connection failures. Program verdicts (AC, WA,
  TLE, RE, ...) are results and are returned as they are. A busy server (503 with Retry-After)
  is retried no sooner than it asked. Every request tells the server how long this call will
  still wait (X-Sandbox-Deadline-S), so that the server answers busy at once rather than
  queueing work nobody will read.
- Every call has a deadline covering all its attempts. When it passes, or the retries run out, the
  still-unanswered requests come back as SANDBOX_ERROR with a message saying why.
- A request the server rejects (HTTP 4xx but 408: bad field, limits above the server's maximums,
  missing token, body too large) raises `SandboxRequestError`: retrying cannot fix the caller's mistake.
- `health()` and `metrics()` are single attempts that raise `SandboxUnavailableError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

import aiohttp
from pydantic import TypeAdapter, ValidationError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from sandbox.metrics import MetricsSnapshot
from sandbox.types import RunRequest, RunResponse, Verdict

if TYPE_CHECKING:
    from sandbox.sessions.remote import RemoteSession

_responses_adapter = TypeAdapter(list[RunResponse])
DEADLINE_HEADER = "X-Sandbox-Deadline-S"  # the server's name for it (sandbox.server)
CONNECT_TIMEOUT_S = 10.0  # a host that does not accept the connection by then is retried


class CodeRunner(Protocol):
    """What an env needs to judge code: satisfied by `Executor` and by `SandboxClient`."""

    async def run(self, request: RunRequest) -> RunResponse: ...

    async def run_many(self, requests: Sequence[RunRequest]) -> list[RunResponse]: ...


class SandboxRequestError(Exception):
    """The server rejected the request (HTTP 4xx); the message is the server's explanation."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"sandbox server rejected the request (HTTP {status}): {message}")
        self.status = status


class SandboxUnavailableError(Exception):
    """The server could not be reached, failed (HTTP 5xx) or answered nonsense.

    `run*` calls retry it and finally report it as SANDBOX_ERROR; `health()`/`metrics()` raise it.
    `retry_after_s` is the server's Retry-After when it was busy: the next attempt waits that long.
    """

    def __init__(self, reason: str, retry_after_s: float = 0.0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass
class _BatchState:
    """Progress of one `run_batch` call across its attempts."""

    results: list[RunResponse | None]  # [num_requests]; None until answered
    pending: list[int]  # indices still to send
    reason: str = "no attempt finished"  # the latest failure, for SANDBOX_ERROR messages


class SandboxClient:
    """Client of `python -m sandbox.server`. Use as `async with SandboxClient(url) as client:`."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        deadline_s: float = 300.0,
        max_retries: int = 4,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
        max_batch_size: int = 256,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be positive, got {deadline_s}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.base_url = base_url.rstrip("/")
        self.deadline_s = deadline_s
        self.max_retries = max_retries
        self.max_batch_size = max_batch_size
        # Jitter of up to one initial delay spreads the retries of many clients after a server hiccup.
        self._wait = wait_exponential_jitter(
            multiplier=backoff_initial_s, jitter=backoff_initial_s, max=backoff_max_s
        )
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def run(self, request: RunRequest) -> RunResponse:
        """Judge one request remotely (retried and bounded by the deadline as described above)."""
        return (await self.run_batch([request]))[0]

    async def run_many(self, requests: Sequence[RunRequest]) -> list[RunResponse]:
        """Judge many requests: batches of `max_batch_size` sent concurrently, answers in order."""
        chunks = [requests[i : i + self.max_batch_size] for i in range(0, len(requests), self.max_batch_size)]
        answers = await asyncio.gather(*(self.run_batch(chunk) for chunk in chunks))
        return [response for answer in answers for response in answer]

    async def run_batch(self, requests: Sequence[RunRequest]) -> list[RunResponse]:
        """Judge `requests` in one `POST /v1/run_batch`; only SANDBOX_ERROR answers are re-sent."""
        if not requests:
            return []
        state = _BatchState(results=[None] * len(requests), pending=list(range(len(requests))))
        deadline = asyncio.get_running_loop().time() + self.deadline_s
        try:
            async with asyncio.timeout_at(deadline):
                async for attempt in self._attempts():
                    with attempt:
                        await self._attempt_batch(requests, state, deadline)
        except SandboxUnavailableError:
            state.reason = f"gave up after {self.max_retries + 1} attempts; last failure: {state.reason}"
        except TimeoutError:
            state.reason = f"deadline of {self.deadline_s} s exceeded; last failure: {state.reason}"
        # Answers the server gave (SANDBOX_ERROR included) are kept; unanswered ones say why.
        return [result or _sandbox_error(state.reason) for result in state.results]

    async def _attempt_batch(
        self, requests: Sequence[RunRequest], state: _BatchState, deadline: float
    ) -> None:
        """Send the pending requests once and store the answers; raise if any must be retried."""
        payload = {"requests": [requests[i].model_dump(mode="json") for i in state.pending]}
        try:
            body = await self._post("/v1/run_batch", payload, deadline)
        except SandboxUnavailableError as failure:
            state.reason = failure.reason
            raise
        try:
            answers = _responses_adapter.validate_python(body["responses"])
        except (KeyError, TypeError, ValidationError) as error:
            state.reason = f"malformed answer from the server: {error}"
            raise SandboxUnavailableError(state.reason) from error
        if len(answers) != len(state.pending):
            state.reason = f"the server answered {len(answers)} of {len(state.pending)} requests"
            raise SandboxUnavailableError(state.reason)
        for index, answer in zip(state.pending, answers, strict=True):
            state.results[index] = answer
        failed = [answer for answer in answers if answer.verdict == Verdict.SANDBOX_ERROR]
        state.pending = [
            i for i, answer in zip(state.pending, answers) if answer.verdict == Verdict.SANDBOX_ERROR
        ]
        if failed:
            state.reason = f"{len(failed)} SANDBOX_ERROR answer(s), first: {failed[0].sandbox_error}"
            raise SandboxUnavailableError(state.reason)

    def _attempts(self) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=self._wait_before_retry,
            retry=retry_if_exception_type(SandboxUnavailableError),
            reraise=True,
        )

    def _wait_before_retry(self, retry_state: RetryCallState) -> float:
        """Exponential backoff with jitter, but never sooner than a busy server's Retry-After."""
        failure = retry_state.outcome.exception() if retry_state.outcome else None
        retry_after_s = failure.retry_after_s if isinstance(failure, SandboxUnavailableError) else 0.0
        return max(self._wait(retry_state), retry_after_s)

    # -- stateful sessions (sandbox.session_routes) --

    async def open_session(self) -> RemoteSession:
        """A session on the server (`POST /v1/sessions`), retried while the server is busy or failing."""
        from sandbox.sessions.remote import RemoteSession  # the sessions package loads backends

        body = await self.session_call("POST", "/v1/sessions", {}, retry=True)
        return RemoteSession(self, body["session_id"])

    async def session_call(
        self, method: str, path: str, payload: dict[str, Any] | None, retry: bool, timeout_s: float = 0.0
    ) -> dict[str, Any]:
        """One session request within the client's deadline (plus `timeout_s`, a command's own).

        `retry`: also retry failures (for requests that change nothing twice); a busy answer
        (503 with Retry-After: nothing was started) is always retried. Raises `SessionFailure`
        once the retries or the deadline run out, `SandboxRequestError` for a 4xx answer.
        """
        from sandbox.sessions.types import SessionFailure

        def retried(error: BaseException) -> bool:
            return isinstance(error, SandboxUnavailableError) and (retry or error.retry_after_s > 0)

        deadline = asyncio.get_running_loop().time() + self.deadline_s + timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                async for attempt in AsyncRetrying(
                    stop=stop_after_attempt(self.max_retries + 1),
                    wait=self._wait_before_retry,
                    retry=retry_if_exception(retried),
                    reraise=True,
                ):
                    with attempt:
                        return await self._request(method, path, payload, deadline)
        except SandboxUnavailableError as error:
            raise SessionFailure(f"sandbox server: {error.reason}") from error
        except TimeoutError as error:
            raise SessionFailure(
                f"sandbox server: no answer to {method} {path} before the deadline"
            ) from error
        raise AssertionError("unreachable")

    async def health(self) -> dict[str, Any]:
        """`GET /health` once, without retries (a health probe must report, not hide, failures)."""
        return await self._get("/health")

    async def metrics(self) -> MetricsSnapshot:
        """`GET /metrics` once, without retries."""
        return MetricsSnapshot.model_validate(await self._get("/metrics"))

    async def _get(self, path: str) -> dict[str, Any]:
        async with asyncio.timeout(self.deadline_s):
            return await self._request("GET", path, None)

    async def _post(self, path: str, payload: dict[str, Any], deadline: float) -> dict[str, Any]:
        return await self._request("POST", path, payload, deadline)

    async def _request(
        self, method: str, path: str, payload: dict[str, Any] | None, deadline: float | None = None
    ) -> dict[str, Any]:
        """One HTTP round trip; `deadline` (event loop time) is sent as the seconds left."""
        if self._session is None:
            # No total timeout of aiohttp's own: the call's deadline is the only clock (default 5 min
            # would cut long batches short and read as a deadline).
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S)
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=timeout)
        headers = {}
        if deadline is not None:
            headers[DEADLINE_HEADER] = f"{max(0.001, deadline - asyncio.get_running_loop().time()):.3f}"
        try:
            async with self._session.request(
                method, self.base_url + path, json=payload, headers=headers
            ) as response:
                if response.status == 503 and "Retry-After" in response.headers:
                    raise SandboxUnavailableError(
                        f"server busy on {path}: {(await response.text())[:500]}",
                        retry_after_s=_seconds(response.headers["Retry-After"]),
                    )
                if response.status >= 500 or response.status == 408:
                    raise SandboxUnavailableError(
                        f"HTTP {response.status} from {path}: {(await response.text())[:500]}"
                    )
                if response.status >= 400:
                    raise SandboxRequestError(response.status, (await response.text())[:2000])
                return await response.json()
        except aiohttp.ClientError as error:
            raise SandboxUnavailableError(f"{type(error).__name__} on {path}: {error}") from error


def _seconds(retry_after: str) -> float:
    """A Retry-After header's delay; only the delay-seconds form is sent by our server."""
    try:
        return max(0.0, float(retry_after))
    except ValueError:
        return 0.0


def _sandbox_error(reason: str) -> RunResponse:
    return RunResponse(verdict=Verdict.SANDBOX_ERROR, sandbox_error=f"sandbox client: {reason}")
