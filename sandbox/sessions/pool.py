"""A warm pool of sandbox sessions: one jail per episode, started ahead, reaped on every exit path.

Stage: episode execution. The pool keeps `num_warm` fresh sessions ready so that an episode's
reset does not wait for a container to start, starts at most `max_starting` jails at once (a
burst of resets on a small machine would otherwise start them all together and each would take
as long as all of them), and holds at most `max_sessions` (ready, in use and starting). A
session handed out lives until its episode closes it or its time-to-live (longer than an
episode plus its scoring) passes, when the pool's reaper closes it. Sessions are never reused
by another episode: closing one gives its jail back to the backend, which empties or discards it.

Every exit path reaps: closing a session (the episode's end), `close()` (the run's end, also
through `async with`, Ctrl-C and exceptions, which unwind through it), and for a process that
was killed outright, the next pool's start: Docker containers are collected by their owner
labels, bwrap sessions by their markers (`sandbox.sessions.leftovers`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from sandbox.backends.base import Backend, JailSession
from sandbox.backends.select import BackendName, docker_engine_answers
from sandbox.sessions import leftovers
from sandbox.sessions.jail import JailBackedSession
from sandbox.sessions.types import SessionFailure, SessionLimits

logger = logging.getLogger(__name__)

SESSION_UID_BASE = 63000  # apart from the judge's bwrap uids (61000..) so neither waits on the other
REAP_INTERVAL_S = 1.0
EXTRA_CONTAINER_PROCESSES = 8  # the Docker runner and slack on top of a command's processes


@dataclass(frozen=True)
class SessionPoolSettings:
    """Which sandbox and how many sessions; pools of equal settings on one event loop are shared."""

    backend: str = "auto"  # "auto" (Docker when an engine answers, else bwrap), "docker" or "bwrap"
    limits: SessionLimits = field(default_factory=SessionLimits)
    num_warm: int = 2  # fresh sessions kept ready
    max_sessions: int = 16  # ready + in use + starting
    max_starting: int = 2  # jails started at once
    ttl_s: float = 1800.0  # a session handed out is closed this long afterwards whatever happens
    work_root: str | None = None  # bwrap: where session dirs live (default: the temp dir)
    uid_base: int = SESSION_UID_BASE  # bwrap: the first of max_sessions jail uids
    image: str | None = None  # docker: the image (default: the sandbox's offline image)

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "docker", "bwrap"):
            raise ValueError(f"backend must be 'auto', 'docker' or 'bwrap', got {self.backend!r}")
        for name in ("max_sessions", "max_starting"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not isinstance(self.num_warm, int) or not 0 <= self.num_warm <= self.max_sessions:
            raise ValueError(
                f"num_warm must be an integer in 0..max_sessions ({self.max_sessions}), got {self.num_warm!r}"
            )
        if not self.ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0 seconds, got {self.ttl_s!r}")


async def _create_backend(settings: SessionPoolSettings) -> Backend:
    limits = settings.limits
    name = settings.backend
    if name == "auto":
        name = BackendName.DOCKER.value if await asyncio.to_thread(docker_engine_answers) else "bwrap"
    if name == "docker":
        from sandbox.backends.docker import DockerBackend  # needs the docker SDK; imported when used

        options: dict[str, Any] = {
            "pool_size": settings.max_sessions,
            "num_warm": 1,  # the pool warms the rest, `max_starting` at a time
            "memory_mb": limits.memory_mb,
            "pids_limit": limits.max_processes + EXTRA_CONTAINER_PROCESSES,
            "cpus": limits.cpus,
            "work_tmpfs_mb": limits.disk_mb,
            "tmp_tmpfs_mb": limits.disk_mb,
        }
        if settings.image is not None:
            options["image"] = settings.image
        return await DockerBackend.create(**options)  # removes the containers of dead owners first
    from sandbox.backends.bwrap import BwrapBackend

    return await BwrapBackend.create(
        uid_base=settings.uid_base,
        num_uids=settings.max_sessions,
        work_root=settings.work_root,
        work_tmpfs_mb=limits.disk_mb,
        tmp_tmpfs_mb=limits.disk_mb,
    )


class SessionPool:
    """Sessions for episodes. Build with `await SessionPool.create(settings)`; `close()` when done."""

    def __init__(self, settings: SessionPoolSettings, backend: Backend, marker_dir: Path | None) -> None:
        self.settings = settings
        self.backend = backend
        self._marker_dir = marker_dir  # bwrap only
        self._ready: collections.deque[JailSession] = collections.deque()
        self._in_use: dict[str, JailBackedSession] = {}
        self._num_live = 0  # ready + in use + starting
        self._changed = asyncio.Condition()
        self._starting = asyncio.Semaphore(settings.max_starting)
        self._markers: dict[int, leftovers.SessionMarker] = {}  # id(jail) -> its marker
        self._tasks: set[asyncio.Task[None]] = set()
        self._num_warming = 0  # background starts of ready sessions in flight
        self._closed = False
        self.num_started = 0
        self.num_expired = 0

    @classmethod
    async def create(cls, settings: SessionPoolSettings | None = None, **overrides: Any) -> SessionPool:
        """Collect what dead owners left, start the backend and begin warming `num_warm` sessions."""
        settings = settings or SessionPoolSettings(**overrides)
        backend = await _create_backend(settings)
        marker_dir = None
        if backend.name == "bwrap":
            marker_dir = await asyncio.to_thread(leftovers.state_dir)
            await asyncio.to_thread(leftovers.collect_leftovers, marker_dir)
            await asyncio.to_thread(leftovers.collect_unheld_session_dirs, backend.work_root)  # type: ignore[attr-defined]
        pool = cls(settings, backend, marker_dir)
        pool._spawn(pool._reap_expired())
        pool._refill()
        return pool

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def num_ready(self) -> int:
        return len(self._ready)

    @property
    def num_in_use(self) -> int:
        return len(self._in_use)

    def session(self, session_id: str) -> JailBackedSession | None:
        return self._in_use.get(session_id)

    async def wait_ready(self, count: int | None = None) -> None:
        """Return once `count` (default `num_warm`) sessions are ready (for start-up and benchmarks)."""
        count = self.settings.num_warm if count is None else count
        async with self._changed:
            await self._changed.wait_for(lambda: self._closed or len(self._ready) >= count)

    async def acquire(self) -> JailBackedSession:
        """A fresh session for one episode: a ready one, or one started now, waiting while the pool is full."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._closed or self._ready or self._num_live < self.settings.max_sessions
            )
            if self._closed:
                raise SessionFailure("the session pool is closed")
            jail = self._ready.popleft() if self._ready else None
            if jail is None:
                self._num_live += 1
        if jail is None:
            jail = await self._start_reserved()
        session = JailBackedSession(
            secrets.token_hex(8),
            jail,
            self.settings.limits,
            time.monotonic() + self.settings.ttl_s,
            self._release,
        )
        self._in_use[session.session_id] = session
        self._refill()
        return session

    async def _start_reserved(self) -> JailSession:
        """Open a jail for a slot already counted in `_num_live`; give the slot back on failure."""
        try:
            async with self._starting:
                if self._closed:
                    raise SessionFailure("the session pool is closed")
                jail = await self.backend.open_session()
        except BaseException:
            async with self._changed:
                self._num_live -= 1
                self._changed.notify_all()
            raise
        self.num_started += 1
        if self._marker_dir is not None:
            marker = leftovers.SessionMarker.of_this_process(jail.root, jail.uid)  # type: ignore[attr-defined]
            leftovers.write_marker(self._marker_dir, marker)
            self._markers[id(jail)] = marker
        return jail

    def _refill(self) -> None:
        """Start sessions in the background until `num_warm` are ready (or starting), within the bounds."""
        if self._closed:
            return
        num_missing = self.settings.num_warm - len(self._ready) - self._num_warming
        free = self.settings.max_sessions - self._num_live
        for _ in range(max(0, min(num_missing, free))):
            self._num_live += 1
            self._num_warming += 1
            self._spawn(self._warm_one())

    async def _warm_one(self) -> None:
        try:
            jail = await self._start_reserved()
        except Exception as error:  # noqa: BLE001 - the next acquire starts one itself and reports it
            logger.warning("could not start a warm sandbox session: %s", error)
            return
        finally:
            self._num_warming -= 1
        # No await between the start and this append: a cancelled warm-up cannot drop a jail,
        # and `close` empties `_ready` after its warm-ups ended.
        self._ready.append(jail)
        async with self._changed:
            self._changed.notify_all()

    async def _release(self, session: JailBackedSession) -> None:
        """A session closed (its jail already given back): free its slot and warm a replacement."""
        self._in_use.pop(session.session_id, None)
        self._forget_marker(session._jail)
        async with self._changed:
            self._num_live -= 1
            self._changed.notify_all()
        self._refill()

    async def _discard(self, jail: JailSession) -> None:
        try:
            await jail.close()
        except Exception as error:  # noqa: BLE001 - a leftover is collected at the next start
            logger.warning("could not close a sandbox session: %s", error)
        self._forget_marker(jail)
        self._num_live -= 1

    def _forget_marker(self, jail: JailSession) -> None:
        marker = self._markers.pop(id(jail), None)
        if marker is not None and self._marker_dir is not None:
            leftovers.remove_marker(self._marker_dir, marker)

    async def _reap_expired(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            now = time.monotonic()
            for session in [s for s in self._in_use.values() if s.expires_at < now]:
                logger.warning("closing sandbox session %s: its time-to-live passed", session.session_id)
                self.num_expired += 1
                with contextlib.suppress(Exception):
                    await session.close()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Close every session (ready and in use) and the backend; sessions in use fail from now on."""
        if self._closed:
            return
        async with self._changed:
            self._closed = True
            self._changed.notify_all()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        # Starts in flight finish (a cancelled SDK call still completes in its thread) and are discarded.
        await asyncio.gather(*tasks, return_exceptions=True)
        sessions = list(self._in_use.values())
        await asyncio.gather(*(session.close() for session in sessions), return_exceptions=True)
        while self._ready:
            await self._discard(self._ready.popleft())
        await self.backend.close()
