"""Environment stage of the code env: one sandbox runner shared by every env of an event loop.

The training loop builds a fresh env per trajectory, so an env cannot own a sandbox: a Docker
warm pool per trajectory would spend more time starting containers than judging. Envs instead
lease a runner (an in-process `sandbox.executor.Executor` or a `sandbox.client.SandboxClient`)
keyed by their event loop and settings. Its semaphore bounds the sandbox calls of all of them,
so `max_concurrency` is a per-process limit, not a per-env one.

A runner outlives its last lease by `IDLE_CLOSE_S`, so that the gap between two training steps
(when no env exists) does not tear down and rebuild the pool. When the event loop shuts down
(`asyncio.run` cancels pending tasks) the pending close runs at once, so nothing is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sandbox.client import CodeRunner, SandboxClient
from sandbox.executor import Executor, default_max_concurrency
from sandbox.types import RunRequest, RunResponse

IDLE_CLOSE_S = 60.0  # longer than a CPU training step, so steps reuse one warm pool
BACKENDS = ("auto", "docker", "bwrap")
Backend = Literal["auto", "docker", "bwrap"]


@dataclass(frozen=True)
class RunnerSettings:
    """Which sandbox to judge with; envs with equal settings on one loop share a runner."""

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
    """A runner, its concurrency bound, and how many envs hold it."""

    def __init__(self, settings: RunnerSettings) -> None:
        self.settings = settings
        self.num_leases = 0  # envs holding this runner
        self._runner: CodeRunner | None = None
        self._started = asyncio.Lock()
        self._slots: asyncio.Semaphore | None = None
        self._max_concurrency: int | None = None
        self._close_task: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        return self._runner is not None

    @property
    def max_concurrency(self) -> int | None:
        """Requests judged at once through this runner (None until it started)."""
        return self._max_concurrency

    async def run(self, request: RunRequest) -> RunResponse:
        """Judge one request; SANDBOX_ERROR comes back as a verdict, as from the runner itself."""
        assert self._runner is not None and self._slots is not None, "run before the lease started"
        async with self._slots:
            return await self._runner.run(request)

    async def run_many(self, requests: Sequence[RunRequest]) -> list[RunResponse]:
        return list(await asyncio.gather(*(self.run(request) for request in requests)))

    async def _start(self) -> None:
        async with self._started:
            if self._runner is not None:
                return
            settings = self.settings
            if settings.sandbox_url is not None:
                self._runner = SandboxClient(settings.sandbox_url, token=settings.sandbox_token)
                limit = settings.max_concurrency
            else:
                executor = await Executor.create(settings.backend, settings.max_concurrency)
                self._runner, limit = executor, executor.max_concurrency
            self._max_concurrency = limit or default_max_concurrency()
            self._slots = asyncio.Semaphore(self._max_concurrency)

    async def _close_when_idle(self, delay_s: float) -> None:
        try:
            await asyncio.sleep(delay_s)
        finally:  # also on cancellation: a re-lease cancels with leases > 0, a loop shutdown with 0
            if self.num_leases == 0:
                _forget(self)
                await self._close_runner()

    async def _close_runner(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.close()


# Runners by event loop, then settings. Weak on the loop: a closed, collected loop drops its entry.
_shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[RunnerSettings, SharedRunner]] = (
    weakref.WeakKeyDictionary()
)


async def lease(settings: RunnerSettings) -> SharedRunner:
    """The running loop's runner for `settings`, started on first use; pair with `release`."""
    runners = _shared.setdefault(asyncio.get_running_loop(), {})
    shared = runners.get(settings)
    if shared is None:
        shared = runners[settings] = SharedRunner(settings)
    shared.num_leases += 1
    if shared._close_task is not None:
        shared._close_task.cancel()
        shared._close_task = None
    try:
        await shared._start()
    except BaseException:
        await release(shared, linger=False)
        raise
    return shared


async def release(shared: SharedRunner, linger: bool = True) -> None:
    """Give a lease back; the last one closes the runner after IDLE_CLOSE_S (now without `linger`)."""
    shared.num_leases -= 1
    if shared.num_leases > 0:
        return
    if linger:
        shared._close_task = asyncio.get_running_loop().create_task(shared._close_when_idle(IDLE_CLOSE_S))
    else:
        _forget(shared)
        await shared._close_runner()


def _forget(shared: SharedRunner) -> None:
    with contextlib.suppress(RuntimeError):  # no running loop: nothing registered under it
        runners = _shared.get(asyncio.get_running_loop(), {})
        if runners.get(shared.settings) is shared:
            del runners[shared.settings]


async def close_all() -> None:
    """Close every runner of the running loop now, leased or not: the end of a script or a test."""
    for shared in _shared.pop(asyncio.get_running_loop(), {}).values():
        if shared._close_task is not None:
            shared._close_task.cancel()
        await shared._close_runner()
