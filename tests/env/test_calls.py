"""Env code runs off the agent loop: async envs on an env loop, sync envs on their own threads."""

import asyncio
import threading

from agentrl.env import TextEnv
from agentrl.env.calls import build_env, call_env

HANG_GUARD_S = 30  # generous bound on waits that end in milliseconds


class AsyncWhere(TextEnv):
    """Records the thread and event loop of each call, and whether its to_thread helper is a daemon."""

    def __init__(self) -> None:
        super().__init__()
        self.places: list[tuple[threading.Thread, asyncio.AbstractEventLoop]] = []
        self.helper_is_daemon: bool | None = None

    def _record(self) -> None:
        self.places.append((threading.current_thread(), asyncio.get_running_loop()))

    async def areset(self, *, seed=None, options=None):
        self._record()
        return [{"role": "user", "content": "go"}], {}

    async def astep(self, action):
        self._record()
        self.helper_is_daemon = await asyncio.to_thread(lambda: threading.current_thread().daemon)
        return [], 1.0, True, False, {}

    async def aclose(self):
        self._record()


class SyncWhere(TextEnv):
    def __init__(self) -> None:
        super().__init__()
        self.threads = [threading.current_thread()]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.threads.append(threading.current_thread())
        return [{"role": "user", "content": "go"}], {}

    def step(self, action):
        self.threads.append(threading.current_thread())
        return [], 1.0, True, False, {}

    def close(self):
        self.threads.append(threading.current_thread())


async def episode(env: TextEnv) -> None:
    await call_env(env, "reset", 5, seed=0, options={})
    await call_env(env, "step", 5, "hi")
    await call_env(env, "close", 5)


def test_an_async_envs_coroutines_run_on_one_env_loop_of_its_own_thread():
    env = AsyncWhere()

    async def main():
        await episode(env)
        return asyncio.get_running_loop()

    agent_loop = asyncio.run(main())
    threads, loops = zip(*env.places, strict=True)
    assert len(env.places) == 3 and len(set(threads)) == 1 and len(set(loops)) == 1
    assert threads[0] is not threading.main_thread() and threads[0].daemon
    assert loops[0] is not agent_loop and loops[0].is_closed()  # shut down with the agent loop
    assert env.helper_is_daemon is True  # a hung to_thread call never keeps the process alive


def test_a_sync_env_is_built_and_called_on_daemon_threads_of_their_own():
    async def main():
        env = await build_env(SyncWhere, 5)
        await episode(env)
        return env

    env = asyncio.run(main())
    assert len(env.threads) == 4 and len(set(env.threads)) == 4
    assert all(thread is not threading.main_thread() and thread.daemon for thread in env.threads)


class WaitsForever(AsyncWhere):
    def __init__(self) -> None:
        super().__init__()
        self.cancelled = threading.Event()
        self.background_cancelled = threading.Event()

    async def areset(self, *, seed=None, options=None):
        self.background = asyncio.get_running_loop().create_task(self._watch())
        return [{"role": "user", "content": "go"}], {}

    async def _watch(self):
        try:
            await asyncio.sleep(3600)
        finally:
            self.background_cancelled.set()

    async def astep(self, action):
        try:
            await asyncio.sleep(3600)
        finally:
            self.cancelled.set()


def test_cancelling_the_caller_cancels_the_env_and_the_env_loop_stops_with_the_agent_loop():
    env = WaitsForever()

    async def main():
        await call_env(env, "reset", 5, seed=0, options={})
        step = asyncio.get_running_loop().create_task(call_env(env, "step", 3600, "hi"))
        await asyncio.sleep(0.1)
        step.cancel()  # as asyncio.run does to the main task on Ctrl-C
        await asyncio.gather(step, return_exceptions=True)
        return await asyncio.to_thread(env.cancelled.wait, HANG_GUARD_S)

    assert asyncio.run(main()) is True
    # The task the env left running was cancelled when the agent loop shut down.
    assert env.background_cancelled.wait(HANG_GUARD_S)
