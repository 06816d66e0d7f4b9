"""Environment stage: run a sync env's blocking calls where a hung call can be abandoned.

`asyncio.to_thread` uses the loop's default executor: a bounded pool whose threads are joined
when `asyncio.run` returns. A sync env whose `step` hangs would hold one of those threads for
good, so a handful of hangs starve every later env call and keep the process alive after
training. Each call here runs on its own daemon thread instead: the step timeout abandons a hung
call, the next call gets a fresh thread, and the interpreter never waits for an abandoned one.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller timed out and cancelled it
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


async def run_in_daemon_thread(function: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
    """Await `function(*args, **kwargs)` run on a fresh daemon thread."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()
    call = functools.partial(contextvars.copy_context().run, function, *args, **kwargs)

    def target() -> None:
        result, error = None, None
        try:
            result = call()
        except BaseException as exc:  # noqa: BLE001  # handed to the awaiting task, which decides
            error = exc
        try:
            loop.call_soon_threadsafe(_settle, future, result, error)
        except RuntimeError:
            pass  # the loop has closed: nobody waits for this call any more

    threading.Thread(target=target, name=f"env-{getattr(function, '__name__', 'call')}", daemon=True).start()
    return await future
