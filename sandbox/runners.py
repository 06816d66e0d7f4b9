"""One sandbox runner per event loop and settings, shared by every caller on that loop.

A caller that judges code now and then (an env's step, a tool call, a reward function) must not
own a sandbox: a Docker warm pool per episode would spend more time starting containers than
judging, and a pool per call leaks when the caller forgets to close it. Callers instead ask for
the running loop's runner (an in-process `sandbox.executor.Executor`, or a `SandboxClient` of a
running `python -m sandbox.server`) with `shared_runner(settings)`. Its semaphore bounds the
sandbox calls of all of them, so `max_concurrency` is a per-process limit, not a per-caller one.

A runner lives as long as its event loop (`sandbox.per_loop`), so later episodes and training
steps reuse one warm pool, and it closes when the loop ends; `close_all()` closes the running
loop's runners earlier (the end of a script or a test).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sandbox.client import CodeRunner, SandboxClient
from sandbox.executor import Executor, default_max_concurrency
from sandbox.per_loop import PerLoop
from sandbox.types import RunRequest, RunResponse

BACKENDS = ("auto", "docker", "bwrap")
Backend = Literal["auto", "docker", "bwrap"]


@dataclass(frozen=True)
class RunnerSettings:
    """Which sandbox to judge with; callers with equal settings on one loop share a runner."""

    backend: Backend = "auto"  # in-process jail when sandbox_url is None
    sandbox_url: str | None = None  # a running `python -m sandbox.server`
    sandbox_token: str | None = None  # its bearer token (required by servers off loopback)
    max_concurrency: int | None = None  # requests judged at once per process; None: one per CPU

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        if self.sandbox_url is not None and not self.sandbox_url.startswith(("http://", "https://")):
            raise ValueError(
                f"sandbox_url must be an http:// or https:// URL of a sandbox server, got {self.sandbox_url!r}"
            )
        if self.max_concurrency is not None and (
            not isinstance(self.max_concurrency, int) or self.max_concurrency < 1
        ):
            raise ValueError(
                f"max_concurrency must be an integer >= 1 (or None for one per CPU), got {self.max_concurrency!r}"
            )


class SharedRunner:
    """The runner of one event loop and settings, and its concurrency bound."""

    def __init__(self, settings: RunnerSettings, loop: asyncio.AbstractEventLoop) -> None:
        self.settings = settings
        self.loop = loop  # the runner's sockets, pools and semaphore belong to this loop
        self._runner: CodeRunner | None = None
        self._slots: asyncio.Semaphore | None = None
        self._max_concurrency: int | None = None

    @property
    def is_open(self) -> bool:
        return self._runner is not None

    @property
    def max_concurrency(self) -> int | None:
        """Requests judged at once through this runner (None until it started)."""
        return self._max_concurrency

    async def run(self, request: RunRequest) -> RunResponse:
        """Judge one request; SANDBOX_ERROR comes back as a verdict, as from the runner itself."""
        assert self._runner is not None and self._slots is not None, "run before the runner started"
        async with self._slots:
            return await self._runner.run(request)

    async def run_many(self, requests: Sequence[RunRequest]) -> list[RunResponse]:
        """Judge many requests concurrently; responses are in request order."""
        return list(await asyncio.gather(*(self.run(request) for request in requests)))

    async def _start(self) -> None:
        """Open the runner; `sandbox.per_loop` calls it once per loop and settings."""
        settings = self.settings
        if settings.sandbox_url is not None:
            self._runner = SandboxClient(settings.sandbox_url, token=settings.sandbox_token)
            self._max_concurrency = settings.max_concurrency or default_max_concurrency()
        else:
            executor = await Executor.create(settings.backend, settings.max_concurrency)
            self._runner, self._max_concurrency = executor, executor.max_concurrency
        self._slots = asyncio.Semaphore(self._max_concurrency)

    async def _close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.close()


async def _start_runner(settings: RunnerSettings) -> SharedRunner:
    shared = SharedRunner(settings, asyncio.get_running_loop())
    await shared._start()
    return shared


_runners: PerLoop[RunnerSettings, SharedRunner] = PerLoop(_start_runner, SharedRunner._close)


async def shared_runner(settings: RunnerSettings) -> SharedRunner:
    """The running loop's runner for `settings`, started on first use, closed when the loop ends.

    Raises what starting it raised (no Docker engine, no bwrap, ...); the next call tries again.
    """
    return await _runners.get(settings)


async def close_all() -> None:
    """Close every runner of the running loop now (the end of a script or a test)."""
    await _runners.close()
