"""The sandbox's front door: judge `RunRequest`s concurrently on one backend.

Callers (the HTTP server, the CLIs, the code environment) hold one `Executor`; its admission
(sandbox.admission) starts runs by CPU and memory, so that jailed programs do not starve each other
into spurious timeouts while programs that sleep or wait do not keep the others waiting.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Protocol, Self, runtime_checkable

from sandbox.admission import RUNS_PER_CPU, Admission, CpuUsage, descendant_cpu_usage
from sandbox.backends.base import Backend
from sandbox.judge import COMPILE_LIMITS, judge, validate_request
from sandbox.types import RunRequest, RunResponse, Verdict

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 5.0


@runtime_checkable
class SelfMeasuredBackend(Protocol):
    """A backend whose jails are not this process's descendants, which measures their CPU use itself."""

    measures_cpu: bool  # whether `cpu_usage` can see its jails on this host

    def cpu_usage(self) -> CpuUsage: ...


def jail_cpu_probe(backend: Backend) -> Callable[[], CpuUsage] | None:
    """How the admission measures the CPU use of the backend's jails; None where it cannot.

    Docker measures its containers itself (their processes are the engine's children); the jails
    of the other backends (bwrap, unsafe-local) are this process's descendants.
    """
    if isinstance(backend, SelfMeasuredBackend):
        return backend.cpu_usage if backend.measures_cpu else None
    return descendant_cpu_usage


def default_max_concurrency() -> int:
    """One per CPU this process may use: how many CPU-bound programs can run without sharing a core."""
    return max(1, len(os.sched_getaffinity(0)))


def physical_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20


def _session_capacity(backend: Backend) -> int | None:
    """How many jails the backend can have open at once, where it has a fixed number."""
    if backend.name == "bwrap":
        return getattr(getattr(backend, "uids", None), "size", None)
    if backend.name == "docker":
        return getattr(getattr(backend, "config", None), "pool_size", None)
    return None


def run_memory_mb(request: RunRequest) -> int:
    """The most memory the request's jail may take at once: its program's limit, or the compiler's."""
    spec = validate_request(request)
    compiler_mb = COMPILE_LIMITS.memory_mb if spec.compile_argv is not None else 0
    return max(request.limits.memory_mb, compiler_mb)


def _cpu_time_s(response: RunResponse) -> float:
    results = [response.compile, response.run, *response.tests]
    return sum(result.cpu_time_s for result in results if result is not None)


class Executor:
    """Runs requests on `backend` as its admission allows.

    `max_concurrency`: runs in flight at once, sleeping ones included (default: `RUNS_PER_CPU` per
    core where the jails' CPU use is measured, bounded by the backend's jails; one per core where
    it cannot be).
    `cpu_slots`: runs always admitted, beyond which a run starts only while the others leave a core
    idle (default: one per core). `memory_budget_mb`: the memory limits of the runs in flight add
    up to at most this (default: the machine's memory).
    """

    def __init__(
        self,
        backend: Backend,
        max_concurrency: int | None = None,
        cpu_slots: int | None = None,
        memory_budget_mb: int | None = None,
    ) -> None:
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 (or None for the default), got {max_concurrency}")
        self.backend = backend
        cpu_probe = jail_cpu_probe(backend)
        if max_concurrency is None:
            max_concurrency = default_max_concurrency() * (RUNS_PER_CPU if cpu_probe else 1)
            max_concurrency = min(max_concurrency, _session_capacity(backend) or max_concurrency)
        self.max_concurrency = max_concurrency
        self.admission = Admission(
            max_concurrency,
            cpu_slots or min(default_max_concurrency(), max_concurrency),
            memory_budget_mb or physical_memory_mb(),
            cpu_probe,
        )

    @classmethod
    async def create(
        cls,
        backend: str = "auto",
        max_concurrency: int | None = None,
        cpu_slots: int | None = None,
        memory_budget_mb: int | None = None,
        **backend_kwargs: Any,
    ) -> Executor:
        """Build the named backend ("auto", "docker", "bwrap", "unsafe-local") and wrap it."""
        from sandbox.backends.select import create_backend

        return cls(
            await create_backend(backend, **backend_kwargs), max_concurrency, cpu_slots, memory_budget_mb
        )

    async def run(self, request: RunRequest, max_wait_s: float | None = None) -> RunResponse:
        """Judge one request. Sandbox failures come back as verdict SANDBOX_ERROR, never raised.

        Raises ValueError for a request no language can honour (checked before it runs), and
        sandbox.admission.AdmissionTimeout when it cannot start within `max_wait_s` (nothing ran).
        """
        async with self.admission.admit(run_memory_mb(request), max_wait_s):
            try:
                response = await judge(self.backend, request)
            except Exception as error:  # nothing a program does may escape as an exception
                logger.exception("the judge raised")
                response = RunResponse(
                    verdict=Verdict.SANDBOX_ERROR,
                    num_tests=len(request.tests),
                    sandbox_error=f"the judge failed: {type(error).__name__}: {error}",
                )
        self.admission.record_cpu_s(_cpu_time_s(response))
        return response

    async def unhealthy_reason(self, timeout_s: float = HEALTH_TIMEOUT_S) -> str | None:
        """None if a jail can be had now; otherwise why not.

        With every run slot taken, or runs waiting, the executor is loaded, not broken: it serves as
        runs finish. Otherwise a session must open within `timeout_s` (the pool may be used up by
        sessions that never came back, or the backend may fail to make jails).
        """
        state = self.admission.state()
        if state.num_running >= state.max_concurrency or state.num_waiting:
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
