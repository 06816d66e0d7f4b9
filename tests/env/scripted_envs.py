"""Tiny envs for the env API tests: one sync-only, one async-only, one implementing nothing."""

import asyncio

from agentrl.env import TextEnv


class SyncCountdown(TextEnv):
    """Sync only: asks for a number drawn from np_random; reward 1.0 when the reply repeats it."""

    def __init__(self, start: int = 2) -> None:
        super().__init__()
        self.start = start
        self.closed = False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.number = int(self.np_random.integers(1000))
        self.remaining = self.start
        return [{"role": "user", "content": f"say {self.number}"}], {"number": self.number}

    def step(self, action):
        self.remaining -= 1
        reward = float(action.strip() == str(self.number))
        terminated = self.remaining == 0
        observation = [] if terminated else [{"role": "user", "content": "again"}]
        return observation, reward, terminated, False, {"remaining": self.remaining}

    def close(self):
        self.closed = True
        super().close()


class AsyncCountdown(TextEnv):
    """Async only: same task; records the event loop of every call."""

    def __init__(self, start: int = 2) -> None:
        super().__init__()
        self.start = start
        self.loops = []
        self.closed = False

    async def areset(self, *, seed=None, options=None):
        self.seed_rng(seed)
        self.loops.append(asyncio.get_running_loop())
        self.number = int(self.np_random.integers(1000))
        self.remaining = self.start
        return [{"role": "user", "content": f"say {self.number}"}], {"number": self.number}

    async def astep(self, action):
        await asyncio.sleep(0)
        self.loops.append(asyncio.get_running_loop())
        self.remaining -= 1
        reward = float(action.strip() == str(self.number))
        terminated = self.remaining == 0
        observation = [] if terminated else [{"role": "user", "content": "again"}]
        return observation, reward, terminated, False, {"remaining": self.remaining}

    async def aclose(self):
        self.closed = True


class Unimplemented(TextEnv):
    """Implements neither pair."""


class NotAnEnv:
    """Not a TextEnv."""
