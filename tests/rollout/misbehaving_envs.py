"""Envs that misbehave the ways that have killed or hung real runs, one way per `behaviour`.

`Misbehaving` is async (its coroutines run on the env loop); `SyncMisbehaving` is sync (its
calls run on daemon threads). `Cycling` takes the next behaviour of `CYCLE` each time one is
built, so a training run (`env.id=tests.rollout.misbehaving_envs:Cycling`) meets all of them.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import numpy as np

from agentrl.env import TextEnv

HUGE = 10_000_000  # characters of the runaway observation
BLOCK_AFTER_S = 4.0  # Cycling's blocker first lets the other episodes of the step take theirs


def _opening(options: dict | None) -> list[dict]:
    if options and "prompt" in options:
        return [dict(message) for message in options["prompt"]]
    return [{"role": "user", "content": "Say something."}]


async def misbehave(behaviour: str, block_after_s: float = 0.0):
    """Do `behaviour` inside an env step; returns the step's result when it returns at all."""
    if behaviour == "blocks_the_loop":
        await asyncio.sleep(block_after_s)
        time.sleep(3600)  # noqa: ASYNC251  # blocks the event loop, on purpose
    if behaviour == "swallows_cancellation":
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue
    if behaviour == "system_exit":
        raise SystemExit(3)
    if behaviour == "keyboard_interrupt":
        raise KeyboardInterrupt
    if behaviour == "system_exit_in_a_thread":
        await asyncio.to_thread(sys_exit_now)
    if behaviour == "hangs_in_a_thread":
        await asyncio.to_thread(time.sleep, 3600)
    if behaviour == "huge_observation":
        return [{"role": "tool", "content": "x" * HUGE}], 0.0, False, False, {}
    if behaviour == "huge_reward":
        return [], 1.7e308, True, False, {}
    if behaviour == "numpy_info":
        info = {"score": np.float32(0.5), "num_calls": np.int64(3), "correct": np.bool_(True)}
        return [], np.float64(1.0), np.bool_(True), False, info
    if behaviour == "object_in_info":
        return [], 1.0, True, False, {"handle": threading.Lock(), "num_calls": 1}
    assert behaviour == "healthy", behaviour
    return [], 1.0, True, False, {"num_calls": 1}


def sys_exit_now() -> None:
    raise SystemExit("sandbox gave up")


class Misbehaving(TextEnv):
    """Async: its step does `behaviour`."""

    def __init__(self, behaviour: str = "healthy", block_after_s: float = 0.0) -> None:
        super().__init__()
        self.behaviour, self.block_after_s = behaviour, block_after_s

    async def areset(self, *, seed=None, options=None):
        self.seed_rng(seed)
        return _opening(options), {}

    async def astep(self, action):
        return await misbehave(self.behaviour, self.block_after_s)


class SyncMisbehaving(TextEnv):
    """Sync: its step raises `error` (on the daemon thread the agent loop runs it on)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return _opening(options), {}

    def step(self, action):
        raise self.error


CYCLE = (
    "healthy",
    "blocks_the_loop",
    "swallows_cancellation",
    "system_exit",
    "keyboard_interrupt",
    "system_exit_in_a_thread",
    "huge_observation",
    "huge_reward",
    "object_in_info",
    "numpy_info",
)
_built = itertools.count()
_built_lock = threading.Lock()


class Cycling(Misbehaving):
    """Each env built takes the next behaviour of CYCLE."""

    def __init__(self) -> None:
        with _built_lock:
            index = next(_built)
        super().__init__(CYCLE[index % len(CYCLE)], block_after_s=BLOCK_AFTER_S)
