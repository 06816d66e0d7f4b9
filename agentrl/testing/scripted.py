"""Testing kit: scripted policies that replay fixed assistant turns.

Two levels, for two kinds of test:

- `play(env, replies, row=...)` steps an env directly with the given assistant texts and
  validates every return at the env boundary, as the agent loop does. No model, no tokens:
  the quickest way to pin what an env answers to a given reply.
- `ScriptedEngine(tokenizer, replies)` is an `InferenceEngine` that returns the replies as
  token ids, so an env can be rolled out by the real agent loop (chat template, budgets,
  token masks) with a known model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.engine.protocol import FinishReason, Generation, SamplingParams
from agentrl.env.base import Message, TextEnv
from agentrl.env.validation import check_reset_return, check_step_return

SCRIPTED_LOGPROB = -0.25  # the log-probability a ScriptedEngine reports for every token


@dataclass(frozen=True)
class ScriptedStep:
    """One replayed assistant turn and what the env returned for it."""

    action: str
    observation: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


@dataclass
class ScriptedEpisode:
    """An episode played from a script: the opening messages and every step."""

    messages: list[Message]
    reset_info: dict[str, Any]
    steps: list[ScriptedStep] = field(default_factory=list)

    @property
    def total_reward(self) -> float:
        return sum(step.reward for step in self.steps)

    @property
    def done(self) -> bool:
        return bool(self.steps) and (self.steps[-1].terminated or self.steps[-1].truncated)

    @property
    def final_info(self) -> dict[str, Any]:
        return self.steps[-1].info if self.steps else {}


async def play(
    env: TextEnv,
    replies: Sequence[str],
    *,
    row: dict[str, Any] | None = None,
    seed: int | None = 0,
    stop_at_end: bool = False,
) -> ScriptedEpisode:
    """Reset `env` on `row` with `seed`, then step it with `replies` in order.

    Raises ValueError when the env returns a malformed value, and, unless `stop_at_end`, when
    the episode ends before every reply was played (a script longer than the episode is
    usually a mistake in the test).
    """
    messages, info = check_reset_return(await env.areset(seed=seed, options=row))
    episode = ScriptedEpisode(messages, info)
    for index, action in enumerate(replies):
        if episode.done and stop_at_end:
            break
        if episode.done:
            raise ValueError(
                f"the episode ended after reply {index - 1}, but the script has {len(replies)} replies; "
                "remove the extra replies"
            )
        result = check_step_return(await env.astep(action))
        episode.steps.append(ScriptedStep(action, *result))
    return episode


def play_sync(
    env: TextEnv,
    replies: Sequence[str],
    *,
    row: dict[str, Any] | None = None,
    seed: int | None = 0,
    stop_at_end: bool = False,
) -> ScriptedEpisode:
    """`play` for code without an event loop (plain test functions, scripts)."""
    return asyncio.run(play(env, replies, row=row, seed=seed, stop_at_end=stop_at_end))


class ScriptedEngine:
    """An InferenceEngine that returns fixed replies (then EOS) as token ids, one per call, cycling.

    `calls` records the prompt ids of every call, so a test can check what the model was shown.
    """

    def __init__(self, tokenizer: Any, replies: Sequence[str], policy_version: int = 0) -> None:
        if not replies:
            raise ValueError("ScriptedEngine needs at least one reply to play")
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.policy_version = policy_version
        self.calls: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        reply = self.replies[len(self.calls) % len(self.replies)]
        self.calls.append(list(prompt_ids))
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        finish = FinishReason.STOP
        if len(ids) > sampling.max_new_tokens:
            ids, finish = ids[: sampling.max_new_tokens], FinishReason.LENGTH
        return Generation(ids, [SCRIPTED_LOGPROB] * len(ids), finish, self.policy_version)

    async def update_weights(self, state_dict: dict, version: int) -> None:
        """A script has no weights; only the version it reports changes."""
        self.policy_version = version

    async def close(self) -> None:
        """Nothing to release."""
