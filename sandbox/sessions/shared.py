"""One session pool per event loop and settings, shared by every env on that loop.

Stage: episode execution. An env must not own a pool (a warm pool per episode would start more
jails than it uses, and one an env forgets to close leaks), so envs ask for the running loop's
pool with `shared_session_pool(settings)`. It lives as long as its loop (`sandbox.per_loop`, as
the judge's runners do), so the run's end, Ctrl-C and an exception that ends the run all close
every session.
"""

from __future__ import annotations

from sandbox.per_loop import PerLoop
from sandbox.sessions.pool import SessionPool, SessionPoolSettings

_pools: PerLoop[SessionPoolSettings, SessionPool] = PerLoop(SessionPool.create, SessionPool.close)


async def shared_session_pool(settings: SessionPoolSettings) -> SessionPool:
    """The running loop's pool for `settings`, started on first use, closed when the loop ends.

    Raises what starting it raised (no Docker engine, no bwrap, ...); the next call tries again.
    """
    return await _pools.get(settings)


async def close_session_pools() -> None:
    """Close the running loop's pools now (the end of a script or a test)."""
    await _pools.close()
