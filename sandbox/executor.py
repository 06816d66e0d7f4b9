"""The sandbox's front door: judge `RunRequest`s concurrently on one backend.

Callers (the HTTP server, the CLIs, the code environment) hold one `Executor`; it bounds
concurrency so that jailed programs do not starve each other into spurious timeouts.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from sandbox.backends.base import Backend
from sandbox.judge import judge, validate_request
from sandbox.types import RunRequest, RunResponse, Verdict

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 5.0


def default_max_concurrency() -> int:
    """One jailed program per CPU this process may use: more only queues them inside the kernel."""
    return max(1, len(os.sched_getaffinity(0)))


class Executor:
    """Runs requests on `backend`, at most `max_concurrency` at a time."""

    def __init__(self, backend: Backend, max_concurrency: int | None = None) -> None:
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 (or None for one per CPU), got {max_concurrency}")
        self.backend = backend
        self.max_concurrency = max_concurrency or default_max_concurrency()
        self._slots = asyncio.Semaphore(self.max_concurrency)

    @classmethod
    async def create(
        cls, backend: str = "auto", max_concurrency: int | None = None, **backend_kwargs: Any
    ) -> Executor:
        """Build the named backend ("auto", "docker", "bwrap", "unsafe-local") and wrap it."""
        from sandbox.backends.select import create_backend

        return cls(await create_backend(backend, **backend_kwargs), max_concurrency)

    async def run(self, request: RunRequest) -> RunResponse:
        """Judge one request. Sandbox failures come back as verdict SANDBOX_ERROR, never raised.

        Raises ValueError only for a request no language can honour (checked before it runs).
        """
        validate_request(request)
        async with self._slots:
            try:
                return await judge(self.backend, request)
            except Exception as error:  # nothing a program does may escape as an exception
                logger.exception("the judge raised")
                return RunResponse(
                    verdict=Verdict.SANDBOX_ERROR,
                    num_tests=len(request.tests),
                    sandbox_error=f"the judge failed: {type(error).__name__}: {error}",
                )

    async def unhealthy_reason(self, timeout_s: float = HEALTH_TIMEOUT_S) -> str | None:
        """None if a jail can be had now; otherwise why not.

        With every slot busy the executor is loaded, not broken: it serves as slots free up.
        With a free slot, a session must open within `timeout_s` (the pool may be used up by
        sessions that never came back, or the backend may fail to make jails).
        """
        if self._slots.locked():
            return None
        try:
            session = await asyncio.wait_for(self.backend.open_session(), timeout_s)
        except TimeoutError:
            return f"no jail could be had within {timeout_s}s although no request is running on every slot"
        except Exception as error:  # noqa: BLE001 - the reason is reported, not raised
            return f"opening a jail failed: {type(error).__name__}: {error}"
        try:
            await session.close()
        except Exception as error:  # noqa: BLE001
            return f"releasing a jail failed: {type(error).__name__}: {error}"
        return None

    async def run_many(self, requests: Sequence[RunRequest]) -> list[RunResponse]:
        """Judge many requests concurrently; responses are in request order."""
        return list(await asyncio.gather(*(self.run(request) for request in requests)))

    async def close(self) -> None:
        await self.backend.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
