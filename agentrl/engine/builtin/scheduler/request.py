"""Inference stage, one request: its inputs, its random stream, the tokens sampled so far, and settling its future."""

from __future__ import annotations

import asyncio
import functools
import random
from dataclasses import dataclass, field
from typing import Any

from agentrl.engine.protocol import FinishReason, Generation, SamplingParams


@dataclass(eq=False)
class Request:
    """One `generate` call: its inputs, its own random stream and the tokens sampled so far."""

    request_id: int  # counts up from 0 in submission order
    prompt_ids: list[int]  # [num_prompt_tokens]
    sampling: SamplingParams
    max_new_tokens: int  # sampling.max_new_tokens, lowered to fit the model's context
    stop_ids: frozenset[int]  # EOS ids and sampling.stop_token_ids
    seed: int  # of `generator`
    future: asyncio.Future  # lives on the caller's event loop
    completion_ids: list[int] = field(default_factory=list)  # [num_completion_tokens]
    logprobs: list[float] = field(default_factory=list)  # [num_completion_tokens]
    finish_reason: FinishReason | None = None
    policy_version: int = 0  # weights version at admission; updates wait for running rows
    cancelled: bool = False  # set by the caller's task when it is cancelled
    cache_length: int = 0  # leading tokens of prompt + completion whose keys/values are in its slot

    @functools.cached_property
    def generator(self) -> random.Random:
        """The request's own random stream: one uniform per sampled token.

        Seeded on first use, by the scheduler's thread: seeding costs microseconds that a caller
        submitting hundreds of requests at once would otherwise spend before any could start.
        """
        return random.Random(self.seed)

    def append(self, token_id: int, logprob: float) -> None:
        """Record one sampled token; a stop token is kept and ends the completion."""
        self.completion_ids.append(token_id)
        self.logprobs.append(logprob)
        if token_id in self.stop_ids:
            self.finish_reason = FinishReason.STOP
        elif len(self.completion_ids) >= self.max_new_tokens:
            self.finish_reason = FinishReason.LENGTH

    @property
    def budget_launched(self) -> bool:
        """Whether the passes launched for it sample its last allowed token: it needs no further step.

        Its prefill pass samples one token and each decode step launched since (one cached position
        each) one more.
        """
        return 1 + self.cache_length - len(self.prompt_ids) >= self.max_new_tokens

    def cached_token_ids(self) -> list[int]:
        """The tokens whose keys/values the request's slot holds, at positions 0.. in order."""
        return (self.prompt_ids + self.completion_ids)[: self.cache_length]

    def generation(self) -> Generation:
        assert self.finish_reason is not None
        return Generation(self.completion_ids, self.logprobs, self.finish_reason, self.policy_version)


def resolve_future(future: asyncio.Future, *, result: Any = None, error: BaseException | None = None) -> None:
    """Complete a caller's future from the scheduler thread, on the caller's own loop."""

    def settle() -> None:
        if future.done():  # the caller was cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        future.get_loop().call_soon_threadsafe(settle)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
        pass
