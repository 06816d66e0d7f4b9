"""Scripted stand-ins for the model and the env, so the agent loop is tested token by token."""

from __future__ import annotations

import time

from agentrl.engine.protocol import FinishReason, Generation, SamplingParams
from agentrl.env.base import TextEnv

LOGPROB = -0.25


class ScriptedEngine:
    """Plays back fixed assistant replies as token ids (followed by EOS), one per generate call."""

    def __init__(self, tokenizer, replies: list[str], fail_on_call: int | None = None) -> None:
        self.tokenizer, self.replies, self.fail_on_call = tokenizer, list(replies), fail_on_call
        self.calls: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        self.calls.append(list(prompt_ids))
        if self.fail_on_call == len(self.calls):
            raise RuntimeError("engine exploded")
        reply = self.replies[(len(self.calls) - 1) % len(self.replies)]
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        finish = FinishReason.STOP
        if len(ids) > sampling.max_new_tokens:
            ids, finish = ids[: sampling.max_new_tokens], FinishReason.LENGTH
        return Generation(ids, [LOGPROB] * len(ids), finish, policy_version=3)

    async def update_weights(self, state_dict, version) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        pass


class GuessEnv(TextEnv):
    """Asks for a number; says 'Wrong, try again.' until the reply is the target or attempts run out."""

    def __init__(self, attempts: int = 3, raise_on_step: bool = False, step_sleep_s: float = 0.0) -> None:
        super().__init__()
        self.attempts, self.raise_on_step, self.step_sleep_s = attempts, raise_on_step, step_sleep_s

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target, self.num_steps = options["target"], 0
        return [{"role": "user", "content": "Guess the number."}], {}

    def step(self, action):
        if self.raise_on_step:
            raise ValueError("broken env")
        time.sleep(self.step_sleep_s)
        self.num_steps += 1
        correct = action.strip() == self.target
        done = correct or self.num_steps >= self.attempts
        feedback = [] if done else [{"role": "user", "content": "Wrong, try again."}]
        return feedback, float(correct), done, False, {"correct": correct}
