"""One session pool per event loop and settings, shared by every env on that loop.

Stage: episode execution. An env must not own a pool (a warm pool per episode would start more
jails than it uses, and one an env forgets to close leaks), so envs ask for the running loop's
pool with `shared_session_pool(settings)`. It lives as long as its loop: a guardian task closes
the loop's pools when it is cancelled, as `asyncio.run` and `asyncio.Runner.close` do to the
tasks left at shutdown (the same scheme as `sandbox.runners` for the judge), so the run's end,
Ctrl-C and an exception that ends the run all close every session.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from dataclasses import dataclass, field

from sandbox.sessions.pool import SessionPool, SessionPoolSettings


@dataclass
class _LoopPools:
    guardian: asyncio.Task[None]
    pools: dict[SessionPoolSettings, SessionPool] = field(default_factory=dict)
    starting: dict[SessionPoolSettings, asyncio.Lock] = field(default_factory=dict)


_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopPools] = weakref.WeakKeyDictionary()


async def shared_session_pool(settings: SessionPoolSettings) -> SessionPool:
    """The running loop's pool for `settings`, started on first use, closed when the loop ends.

    Raises what starting it raised (no Docker engine, no bwrap, ...); the next call tries again.
    """
    loop = asyncio.get_running_loop()
    entry = _loops.get(loop)
    if entry is None:
        entry = _loops[loop] = _LoopPools(guardian=loop.create_task(_close_at_shutdown(loop)))
    lock = entry.starting.setdefault(settings, asyncio.Lock())
    async with lock:
        if settings not in entry.pools:
            entry.pools[settings] = await SessionPool.create(settings)
    return entry.pools[settings]


async def close_session_pools() -> None:
    """Close the running loop's pools now (the end of a script or a test)."""
    entry = _loops.pop(asyncio.get_running_loop(), None)
    if entry is not None:
        entry.guardian.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await entry.guardian
        for pool in entry.pools.values():
            await pool.close()


async def _close_at_shutdown(loop: asyncio.AbstractEventLoop) -> None:
    try:
        await loop.create_future()  # never resolved: this task only ends by cancellation
    finally:
        entry = _loops.get(loop)
        if entry is not None and entry.guardian is asyncio.current_task():
            _loops.pop(loop, None)
            for pool in entry.pools.values():
                await pool.close()
