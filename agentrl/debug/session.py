"""Debugger: one live episode under a person's control, on the agent loop's own stepping API.

Every turn goes through `agentrl.rollout.episode.Episode`, so tokens, masks, statuses and
budgets are exactly what training produces. A typed (human) turn is a `Generation` built from
the text as the tokenizer encodes it plus the end-of-turn token the template expects, scored
by the policy model when the engine exposes one. Rewinding replays the committed turns on a
fresh env reset with the same seed, so a deterministic env comes back to the same state.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.engine.protocol import FinishReason, Generation, InferenceEngine
from agentrl.env.base import TextEnv
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.config import Budgets, Sampling
from agentrl.rollout.episode import Episode
from agentrl.rollout.trajectory import Turn


@dataclass
class EpisodeSetup:
    """Everything an episode of the debugger is built from."""

    make_env: Any  # () -> TextEnv
    engine: InferenceEngine
    template: ChatTemplate
    row: dict[str, Any]
    row_index: int
    seed: int  # env reset seed
    sampling_seed: int
    budgets: Budgets
    sampling: Sampling
    stop_token_id: int  # the token that ends an assistant turn in this template


def score_completion(
    model: torch.nn.Module, context_ids: list[int], completion_ids: list[int], temperature: float
) -> list[float]:
    """log softmax(logits / temperature) of each completion token, as the engine reports logprobs."""
    device = next(model.parameters()).device
    ids = torch.tensor([context_ids + completion_ids], device=device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(context_ids) - 1 : -1].float() / temperature
    targets = torch.tensor(completion_ids, device=device)[:, None]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets).squeeze(-1).tolist()


class DebugSession:
    """Step, resample, rewind, type turns and save one episode."""

    def __init__(self, setup: EpisodeSetup, policy: str) -> None:
        if policy not in ("model", "human"):
            raise ValueError(f"policy must be 'model' or 'human', got {policy!r}")
        self.setup, self.policy = setup, policy
        self.sampling = setup.sampling
        self.env: TextEnv | None = None
        self.episode: Episode | None = None
        self.committed: list[Generation] = []  # what each turn so far was built from, for rewind
        self.candidates: list[Generation] = []  # samples of the current turn, not committed

    async def start(self) -> None:
        """Reset a fresh env on the task row."""
        if self.env is not None:
            self.env.close()
        setup = self.setup
        self.env = setup.make_env()
        self.episode = Episode(
            self.env, setup.engine, setup.template, setup.row,
            group_id=setup.row_index, seed=setup.seed, sampling_seed=setup.sampling_seed,
            budgets=setup.budgets, sampling=self.sampling,
        )  # fmt: skip
        self.committed, self.candidates = [], []
        await self.episode.reset()

    def _require_open(self) -> Episode:
        if self.episode is None or self.episode.done:
            raise ValueError("the episode is over; `rewind K` to go back to turn K, or `save PATH`")
        return self.episode

    async def _commit(self, generation: Generation | None) -> Turn | None:
        turn = await self.episode.commit(generation)
        if generation is not None and turn is not None:
            self.committed.append(generation)
        self.candidates = []
        return turn

    async def step(self) -> Turn | None:
        """The policy samples the next turn and it is committed."""
        episode = self._require_open()
        return await self._commit(await episode.generate(self.sampling))

    async def sample(self, k: int) -> list[Generation]:
        """k samples of the current turn, each with its own seed; none is committed until `pick`."""
        if k < 1:
            raise ValueError(f"sample needs k >= 1, got {k}")
        episode = self._require_open()
        base = self.setup.sampling_seed + 1000 * (len(episode.trajectory.turns) + 1)
        candidates = []
        for i in range(k):
            generation = await episode.generate(self.sampling, seed=base + i)
            if generation is None:  # the engine failed: the episode recorded engine_error
                break
            candidates.append(generation)
        self.candidates = candidates
        return candidates

    async def pick(self, index: int) -> Turn | None:
        if not 0 <= index < len(self.candidates):
            raise ValueError(
                f"pick needs one of 0..{len(self.candidates) - 1} (run `sample K` first), got {index}"
            )
        self._require_open()
        return await self._commit(self.candidates[index])

    def typed_generation(self, text: str) -> Generation:
        """A person's turn: the text's tokens plus the end-of-turn token, scored by the policy if it can be."""
        episode = self._require_open()
        template = self.setup.template
        completion_ids = template.encode(text) + [self.setup.stop_token_id]
        model = getattr(self.setup.engine, "model", None)
        context = episode.trajectory.prompt_ids + episode.trajectory.response_ids
        logprobs = (
            score_completion(model, context, completion_ids, self.sampling.temperature)
            if isinstance(model, torch.nn.Module)
            else [0.0] * len(completion_ids)
        )
        version = getattr(self.setup.engine, "policy_version", 0)
        return Generation(completion_ids, logprobs, FinishReason.STOP, version)

    async def say(self, text: str) -> Turn | None:
        """Commit a typed assistant turn."""
        return await self._commit(self.typed_generation(text))

    async def rewind(self, turn: int) -> None:
        """Go back to just before turn `turn` (1-based): reset and replay the turns before it."""
        if not 1 <= turn <= len(self.committed) + 1:
            raise ValueError(f"rewind needs a turn in 1..{len(self.committed) + 1}, got {turn}")
        replay = self.committed[: turn - 1]
        await self.start()
        for generation in replay:
            await self._commit(generation)

    def set_temperature(self, temperature: float) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (sampling, as in training), got {temperature}")
        self.sampling = dataclasses.replace(self.sampling, temperature=temperature)

    def save(self, path: Path) -> None:
        """Append the episode as one JSONL line, the format training dumps in rollouts/step_N.jsonl."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            handle.write(json.dumps(self.episode.trajectory.to_json()) + "\n")

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
