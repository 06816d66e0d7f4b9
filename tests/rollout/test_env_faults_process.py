"""Env faults seen from the process: it exits after abandoned envs, and a real Ctrl-C still stops it."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 60  # generous: each script takes a few seconds

PRELUDE = """
import asyncio, sys, time
from transformers import AutoTokenizer
from agentrl.env import TextEnv
from agentrl.rollout.agent_loop import Budgets, Sampling, run_episode_with_retries
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from tests.rollout.misbehaving_envs import Misbehaving, SyncMisbehaving
from tests.rollout.scripted import ScriptedEngine

tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
template = ChatTemplate(tokenizer)

async def statuses(make_envs, step_timeout_s):
    budgets = Budgets(1, 8, 256, step_timeout_s=step_timeout_s, episode_timeout_s=3600)
    trajectories = await asyncio.gather(*(
        run_episode_with_retries(make_env, 0, engine=ScriptedEngine(tokenizer, ["hi"]), template=template, row={},
                                 group_id=0, seed=0, sampling_seed=0, budgets=budgets, sampling=Sampling())
        for make_env in make_envs
    ))
    return [t.status.value for t in trajectories]
"""

ABANDONING_RUN = (
    PRELUDE
    + """
class SyncHangs(SyncMisbehaving):
    def step(self, action):
        time.sleep(3600)

async def main():
    print(await statuses([lambda: Misbehaving("blocks_the_loop")], 0.5))
    print(await statuses([
        lambda: Misbehaving("swallows_cancellation"), lambda: Misbehaving("hangs_in_a_thread"),
        lambda: SyncHangs(None), lambda: Misbehaving("healthy"),
    ], 0.5))

asyncio.run(main())
"""
)


def test_the_process_exits_after_envs_that_block_swallow_cancellation_or_hang_are_abandoned():
    result = subprocess.run(
        [sys.executable, "-c", ABANDONING_RUN], cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [
        "['env_error']",
        "['truncated_time', 'truncated_time', 'truncated_time', 'completed']",
    ]
    assert "env code blocks its event loop: Misbehaving.astep, in misbehave at " in result.stderr


INTERRUPTED_RUN = (
    PRELUDE
    + """
class Announces(Misbehaving):
    async def astep(self, action):
        print(f"stepping {self.behaviour}", flush=True)
        return await super().astep(action)

async def main():
    # The env's own SystemExit and KeyboardInterrupt end only their episodes.
    print(await statuses([
        lambda: Misbehaving("keyboard_interrupt"), lambda: SyncMisbehaving(KeyboardInterrupt()),
        lambda: Misbehaving("system_exit"), lambda: SyncMisbehaving(SystemExit(1)), lambda: Misbehaving("healthy"),
    ], 5), flush=True)
    # Both envs hold their step for good, one by ignoring cancellation, one by blocking its event loop.
    print(await statuses([lambda: Announces("swallows_cancellation"), lambda: Announces("blocks_the_loop", 0.5)], 600))

try:
    asyncio.run(main())
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""
)


def read_until(process: subprocess.Popen, wanted: list[str], timeout_s: float) -> list[str]:
    """Lines of the process's stdout up to and including every line in `wanted`; fails past timeout_s.

    Reads the pipe's file descriptor directly: a buffered readline may take two lines off the pipe
    at once, and select() would then wait for a second line already read.
    """
    received, lines = b"", []
    deadline = time.monotonic() + timeout_s
    while not set(wanted) <= set(lines):
        ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no {wanted} within {timeout_s} s; got {lines}"
        chunk = os.read(process.stdout.fileno(), 65536)
        assert chunk, (
            f"the process ended before printing {wanted}; got {lines}: {process.stderr.read()[-3000:]}"
        )
        *complete, received = (received + chunk).split(b"\n")
        lines += [line.decode() for line in complete]
    return lines


def test_ctrl_c_stops_the_run_while_env_code_holds_its_step_but_an_envs_own_keyboard_interrupt_does_not():
    # A suite started in the background has SIGINT ignored, and a child would inherit that; a
    # handler (unlike "ignore") is reset to the default when the child starts.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", INTERRUPTED_RUN], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        lines = read_until(
            process, ["stepping swallows_cancellation", "stepping blocks_the_loop"], timeout_s=HANG_GUARD_S
        )
        assert lines[0] == "['env_error', 'env_error', 'env_error', 'env_error', 'completed']"
        time.sleep(1.0)  # let the blocker start blocking its loop (not a timed assertion)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=HANG_GUARD_S)
    finally:
        process.kill()
    assert process.returncode == 130, stderr[-3000:]
    assert stdout.splitlines() == ["interrupted"]
