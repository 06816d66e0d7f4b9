"""Environment stage boundary: where env code runs, so that no env can stop or hang the agent loop.

The agent loop (the event loop that drives episodes, the engine and training) never runs env
code on its own thread:

- building an env, and a sync env's `reset`/`step`/`close`, run on a fresh daemon thread per
  call (`threads.py`);
- an async env's `areset`/`astep`/`aclose` run on an *env loop*: an event loop on a daemon thread
  of its own, shared by the envs of one agent loop, so what an env keeps per event loop (the code
  env's sandbox runner) is shared as before. An env stays on the env loop of its first call.

`call_env` awaits every call under a timeout and never waits for the env beyond it: on timeout it
asks the env's task to cancel and returns at once, so an env that swallows the cancellation keeps
running, abandoned, without holding the episode (`asyncio.wait_for` would wait for it). A
timed-out call then probes its env loop: a loop that runs no callback within `PROBE_S` is blocked
by code that never yields (`time.sleep` inside a coroutine). The error names the blocked frame,
a warning shows the loop thread's stack once, and the loop is abandoned: envs built afterwards
run on a fresh one, and its daemon thread never keeps the process alive.

A `SystemExit`, `KeyboardInterrupt` or other `BaseException` that env code raises arrives as
`EnvAborted`. Signals are delivered to the main thread only, and env code never runs there, so
such an exception is always the env's own doing; the user's Ctrl-C still stops the run:
`asyncio.run` cancels the main task, and `call_env` passes the cancellation on to the env.

When the agent loop shuts down (`asyncio.run` cancels its remaining tasks), a guardian task there
shuts its env loops down: their tasks are cancelled and get up to `SHUTDOWN_S` to finish (calls
already abandoned are not waited for), so per-loop resources close as they did when envs ran on
the agent loop itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import linecache
import os
import selectors
import sys
import threading
import traceback
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from agentrl.env.base import TextEnv
from agentrl.env.threads import (
    DaemonThreadExecutor,
    as_exception,
    settle_threadsafe,
    start_in_daemon_thread,
)

PROBE_S = 1.0  # an env loop that runs no callback for this long after a call timed out is blocked
SHUTDOWN_S = 30.0  # time an env loop's tasks get to finish once the agent loop shuts down
ASYNC_METHODS = {"reset": "areset", "step": "astep", "close": "aclose"}
# Frames of these files are the loop's machinery, not env code.
_MACHINERY = tuple(os.path.dirname(module.__file__) + os.sep for module in (asyncio, concurrent.futures)) + (
    threading.__file__,
    selectors.__file__,
    __file__,
)


class EnvCallTimeout(Exception):
    """An env call did not return within its timeout.

    `blocked_at` names the env code that blocks the env loop, when the loop is blocked;
    `blocked_by_this_call` tells whether it is this call's own code.
    """

    def __init__(
        self, method: str, timeout_s: float, blocked_at: str | None = None, blocked_by_this_call: bool = False
    ) -> None:
        where = f"; its event loop is blocked in {blocked_at}" if blocked_at else ""
        super().__init__(f"env {method} did not return within {timeout_s} s{where}")
        self.method, self.timeout_s = method, timeout_s
        self.blocked_at, self.blocked_by_this_call = blocked_at, blocked_by_this_call


async def build_env(make_env: Callable[[], TextEnv], timeout_s: float) -> TextEnv:
    """`make_env()` run on a daemon thread; raises what it raised, or `EnvCallTimeout("build", ...)`."""
    return await _within(start_in_daemon_thread(make_env), "build", timeout_s)


async def call_env(env: TextEnv, method: str, timeout_s: float, /, *args: Any, **kwargs: Any) -> Any:
    """What `env.<method>(*args, **kwargs)` returned (method reset, step or close), within `timeout_s`.

    Runs the async variant on the env's env loop when the env implements it, else the sync one on
    a daemon thread. Raises what the env raised (`EnvAborted` for a `SystemExit`, ...), or
    `EnvCallTimeout`.
    """
    async_method = ASYNC_METHODS[method]
    if getattr(type(env), async_method) is getattr(TextEnv, async_method):
        return await _within(start_in_daemon_thread(getattr(env, method), *args, **kwargs), method, timeout_s)
    env_loop = _env_loop_of(env)
    # A close follows every failed call too, which may have left the loop blocked: look first.
    if method == "close" or env_loop.blocked_at is not None:
        blocked_at, _ = await env_loop.diagnose()
        if blocked_at is not None:
            raise EnvCallTimeout(method, timeout_s, blocked_at)
    return await env_loop.call(getattr(env, async_method), args, kwargs, method, timeout_s)


async def _within(future: asyncio.Future, method: str, timeout_s: float) -> Any:
    try:
        done, _ = await asyncio.wait({future}, timeout=timeout_s)
    finally:
        future.cancel()  # a no-op once settled; otherwise a late result is dropped
    if not done:
        raise EnvCallTimeout(method, timeout_s)
    return future.result()


@dataclass
class _Call:
    """One env coroutine on an env loop; `task` and `coroutine` are set on the env loop's thread."""

    task: asyncio.Task | None = None
    coroutine: Any = None


class EnvLoop:
    """An event loop on a daemon thread of its own, where env coroutines run."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        # `to_thread` calls of env code run on daemon threads: none is joined at shutdown or exit.
        self.loop.set_default_executor(DaemonThreadExecutor())
        self.blocked_at: str | None = None  # the env code found blocking this loop; set on the agent loop
        self._abandoned: weakref.WeakSet[asyncio.Task] = weakref.WeakSet()  # used on the env thread only
        self._closed: list[Callable[[], None]] = []  # told once the loop has closed
        self._thread = threading.Thread(target=self._serve, name="agentrl-env-loop", daemon=True)
        self._thread.start()

    @property
    def is_closed(self) -> bool:
        return self.loop.is_closed()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            while True:
                try:
                    self.loop.run_forever()
                except BaseException as error:  # noqa: BLE001  # raised by an env's own task or callback
                    warnings.warn(
                        f"env code on the env loop raised {type(error).__name__}: {error}; the loop goes on",
                        RuntimeWarning,
                        stacklevel=1,
                    )
                else:
                    return
        finally:
            self.loop.close()
            for tell in self._closed:
                tell()

    async def call(
        self, function: Callable[..., Any], args: tuple, kwargs: dict, method: str, timeout_s: float
    ) -> Any:
        """Await `function(*args, **kwargs)` run on this loop, for at most `timeout_s`."""
        agent_loop = asyncio.get_running_loop()
        settled = agent_loop.create_future()
        call = _Call()
        try:
            self.loop.call_soon_threadsafe(self._start, call, function, args, kwargs, agent_loop, settled)
        except RuntimeError:
            raise RuntimeError(f"env {method}: its env loop has closed (its agent loop shut down)") from None
        try:
            done, _ = await asyncio.wait({settled}, timeout=timeout_s)
        finally:
            if not settled.done():  # timed out, or this task was cancelled (Ctrl-C): abandon the call
                settled.cancel()
                self._cancel_threadsafe(call)
        if done:
            return settled.result()
        blocked_at, blocked_by_this_call = await self.diagnose(call)
        raise EnvCallTimeout(method, timeout_s, blocked_at, blocked_by_this_call)

    def _start(
        self,
        call: _Call,
        function: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        agent_loop: asyncio.AbstractEventLoop,
        settled: asyncio.Future,
    ) -> None:
        call.task = self.loop.create_task(self._run(call, function, args, kwargs, agent_loop, settled))

    async def _run(
        self,
        call: _Call,
        function: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        agent_loop: asyncio.AbstractEventLoop,
        settled: asyncio.Future,
    ) -> None:
        result, error = None, None
        try:
            call.coroutine = function(*args, **kwargs)
            result = await call.coroutine
        except BaseException as exc:  # noqa: BLE001  # handed to the awaiting episode, which types it
            error = as_exception(exc)
        settle_threadsafe(agent_loop, settled, result, error)

    def _cancel_threadsafe(self, call: _Call) -> None:
        try:
            self.loop.call_soon_threadsafe(self._cancel, call)
        except RuntimeError:
            pass  # closed: nothing runs there any more

    def _cancel(self, call: _Call) -> None:
        # Scheduled after `_start`, so the task exists. It may ignore this: nobody waits for it.
        if call.task is not None and not call.task.done():
            self._abandoned.add(call.task)
            call.task.cancel()

    async def responsive(self, within_s: float = PROBE_S) -> bool:
        """Whether this loop runs a callback within `within_s`."""
        agent_loop = asyncio.get_running_loop()
        answered = agent_loop.create_future()
        try:
            self.loop.call_soon_threadsafe(settle_threadsafe, agent_loop, answered, True, None)
        except RuntimeError:
            return False
        try:
            done, _ = await asyncio.wait({answered}, timeout=within_s)
        finally:
            answered.cancel()
        return bool(done)

    async def diagnose(self, call: _Call | None = None) -> tuple[str | None, bool]:
        """Where env code blocks this loop (None when it answers a probe), and whether it is `call`'s.

        The first time the loop is found blocked, a warning shows its thread's stack.
        """
        if await self.responsive():
            return None, False
        top = sys._current_frames().get(self._thread.ident)  # how faulthandler-like tools see another thread
        if top is None:  # the thread has ended
            return None, False
        frames = _outermost_first(top)
        where = _describe(frames)
        coroutine_frame = getattr(call.coroutine, "cr_frame", None) if call is not None else None
        by_this_call = coroutine_frame is not None and any(frame is coroutine_frame for frame in frames)
        if self.blocked_at is None:
            self.blocked_at = where
            warnings.warn(
                f"env code blocks its event loop: {where}. The loop is abandoned (envs built from now on "
                "run on a fresh one); an async env must await, never block (use asyncio.to_thread for "
                "blocking work). The loop thread's stack:\n" + "".join(traceback.format_stack(top)),
                RuntimeWarning,
                stacklevel=1,
            )
        return where, by_this_call

    async def shut_down(self) -> None:
        """Cancel this loop's tasks, give those not abandoned up to SHUTDOWN_S, then stop and close it."""
        if self.is_closed or not await self.responsive():
            return  # a blocked loop is left to its daemon thread
        agent_loop = asyncio.get_running_loop()
        stopped = agent_loop.create_future()
        try:
            self.loop.call_soon_threadsafe(self._begin_stop, agent_loop, stopped)
        except RuntimeError:
            return
        await asyncio.wait({stopped}, timeout=SHUTDOWN_S + PROBE_S)

    def _begin_stop(self, agent_loop: asyncio.AbstractEventLoop, stopped: asyncio.Future) -> None:
        self.loop.create_task(self._stop(agent_loop, stopped))

    async def _stop(self, agent_loop: asyncio.AbstractEventLoop, stopped: asyncio.Future) -> None:
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        awaited = [task for task in tasks if task not in self._abandoned]
        if awaited:
            await asyncio.wait(awaited, timeout=SHUTDOWN_S)
        for task in tasks:
            if not task.done():  # it ignores cancellation: left pending on purpose, not reported at exit
                task._log_destroy_pending = False
        closing = asyncio.ensure_future(self.loop.shutdown_asyncgens())
        await asyncio.wait({closing}, timeout=PROBE_S)
        self._closed.append(lambda: settle_threadsafe(agent_loop, stopped, None, None))
        self.loop.stop()  # `_serve` closes the loop once run_forever returns, then settles `stopped`


@dataclass
class _EnvLoops:
    """The env loops one agent loop has made: the one new envs go to, and all of them for shutdown."""

    current: EnvLoop | None = None
    made: list[EnvLoop] = field(default_factory=list)
    guardian: asyncio.Task | None = None


_env_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _EnvLoops] = weakref.WeakKeyDictionary()
_env_loops_lock = threading.Lock()


def _env_loop_of(env: TextEnv) -> EnvLoop:
    """The env loop `env` runs on: the one of its first call, or the running agent loop's current one."""
    home = env._env_loop  # the env's slot for this module
    if home is None or home.is_closed:
        home = env._env_loop = _current_env_loop()
    return home


def _current_env_loop() -> EnvLoop:
    agent_loop = asyncio.get_running_loop()
    with _env_loops_lock:
        loops = _env_loops.get(agent_loop)
        if loops is None:
            loops = _env_loops[agent_loop] = _EnvLoops()
            loops.guardian = agent_loop.create_task(
                _shut_down_with_agent_loop(loops), name="env-loops-guardian"
            )
        if loops.current is None or loops.current.blocked_at is not None:
            loops.current = EnvLoop()
            loops.made.append(loops.current)
        return loops.current


async def _shut_down_with_agent_loop(loops: _EnvLoops) -> None:
    """Wait until cancelled (the agent loop shuts down), then shut its env loops down."""
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        await asyncio.gather(*(env_loop.shut_down() for env_loop in loops.made))


def _outermost_first(top: FrameType) -> list[FrameType]:
    frames = []
    frame: FrameType | None = top
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames[::-1]


def _describe(frames: list[FrameType]) -> str:
    """`Env.astep at file:line (source)`: the outermost and innermost frames of env code on the stack."""
    own = [frame for frame in frames if not frame.f_code.co_filename.startswith(_MACHINERY)]
    if not own:
        return "code outside any env"
    outer, inner = own[0], own[-1]
    source = linecache.getline(inner.f_code.co_filename, inner.f_lineno).strip()
    where = f"{inner.f_code.co_filename}:{inner.f_lineno}" + (f" ({source})" if source else "")
    if inner is outer:
        return f"{outer.f_code.co_qualname} at {where}"
    return f"{outer.f_code.co_qualname}, in {inner.f_code.co_qualname} at {where}"
