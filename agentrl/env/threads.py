"""Environment stage: run an env's blocking calls where a hung call can be abandoned.

`asyncio.to_thread` uses the loop's default executor: a bounded pool whose threads are joined
when `asyncio.run` returns (and again at interpreter exit). A sync env whose `step` hangs would
hold one of those threads for good, so a handful of hangs starve every later env call and keep
the process alive after training. Each call here runs on its own daemon thread instead: the step
timeout abandons a hung call, the next call gets a fresh thread, and the interpreter never waits
for an abandoned one. `DaemonThreadExecutor` does the same for `to_thread` calls that env code
makes on the env loop (`agentrl.env.calls`).

A `SystemExit` or `KeyboardInterrupt` raised by the function reaches the awaiting task as
`EnvAborted`: re-raised there, it would stop the caller's whole event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from agentrl.env.errors import EnvAborted

_T = TypeVar("_T")


def settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """Complete `future` with `result` or `error`, unless its awaiter gave up and cancelled it."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def settle_threadsafe(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: Any, error: BaseException | None
) -> None:
    """`settle` on `loop` from another thread; nothing when the loop has closed (nobody waits any more)."""
    try:
        loop.call_soon_threadsafe(settle, future, result, error)
    except RuntimeError:
        pass


def as_exception(error: BaseException) -> Exception:
    """`error` itself if it is an `Exception`; a `SystemExit`, `KeyboardInterrupt`, ... as `EnvAborted`."""
    return error if isinstance(error, Exception) else EnvAborted(error)


def start_in_daemon_thread(function: Callable[..., _T], /, *args: Any, **kwargs: Any) -> asyncio.Future:
    """Start `function(*args, **kwargs)` on a fresh daemon thread; a future of the running loop settles with it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()
    call = functools.partial(contextvars.copy_context().run, function, *args, **kwargs)

    def target() -> None:
        result, error = None, None
        try:
            result = call()
        except BaseException as exc:  # noqa: BLE001  # handed to the awaiting task, which decides
            error = as_exception(exc)
        settle_threadsafe(loop, future, result, error)

    threading.Thread(target=target, name=f"env-{getattr(function, '__name__', 'call')}", daemon=True).start()
    return future


async def run_in_daemon_thread(function: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
    """Await `function(*args, **kwargs)` run on a fresh daemon thread."""
    return await start_in_daemon_thread(function, *args, **kwargs)


class DaemonThreadExecutor(concurrent.futures.ThreadPoolExecutor):
    """An executor that runs each call on a fresh daemon thread and never waits for one at shutdown.

    A ThreadPoolExecutor by type only, as `loop.set_default_executor` requires; it has no pool.
    """

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[_T]:
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def target() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001  # handed to the awaiting code
                future.set_exception(as_exception(exc))

        threading.Thread(target=target, name=f"env-{getattr(fn, '__name__', 'call')}", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to join: a call still running is abandoned with its daemon thread."""
