"""Debugger: one live episode under a person's control, on the agent loop's own stepping API.

Every turn goes through `agentrl.rollout.episode.Episode`, so tokens, masks, statuses and
budgets are exactly what training produces. A typed (human) turn is a `Generation` built from
the text as the tokenizer encodes it plus the end-of-turn token the template expects, scored
by the policy model when the engine exposes one. Rewinding replays the committed turns on a
fresh env reset with the same seed, so a deterministic env comes back to the same state; each
of K samples is tried the same way on a fresh env, to show its reward without committing it.

Cancelling a command (Ctrl-C) leaves the episode whole: a rewind builds the new episode aside and
swaps it in only when done, and an env step already under way finishes before the cancellation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.engine.protocol import FinishReason, Generation, InferenceEngine
from agentrl.env.base import TextEnv
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.config import Budgets, Sampling
from agentrl.rollout.episode import Episode
from agentrl.rollout.trajectory import Status, Trajectory, Turn

RUNNING = "running"  # Candidate.status of a sample after which the episode goes on


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
    env_name: str  # env.id, or the mixture entry the row belongs to


@dataclass(frozen=True)
class Candidate:
    """One sample of the current turn, and what the env answered when it was tried on a fresh env."""

    generation: Generation  # as sampled; committing cuts it at a special token (see finish_reason)
    finish_reason: str  # the turn's, as the loop records it
    reward: float | None  # the env's reward for this turn; None when the env failed on it
    status: str  # RUNNING, or the status the episode would end with
    info: dict[str, Any]  # the env's info after it (the error, when the env failed)


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
        self.candidates: list[Candidate] = []  # samples of the current turn, not committed

    async def start(self) -> None:
        """Reset a fresh env on the task row."""
        await self._restart([])

    async def _restart(self, turns: list[Generation]) -> None:
        """Swap in a fresh episode with `turns` replayed; a cancellation meanwhile keeps the old one."""
        episode = await self._fresh_episode(turns)
        previous, self.episode, self.env = self.episode, episode, episode.env
        self.committed = turns[: len(episode.trajectory.turns)]
        self.candidates = []
        if previous is not None:
            await previous.env.aclose()

    async def _fresh_episode(self, turns: list[Generation]) -> Episode:
        """A new env reset on the row, with `turns` committed (a deterministic env comes back to its state)."""
        setup = self.setup
        env = setup.make_env()
        episode = Episode(
            env, setup.engine, setup.template, setup.row,
            group_id=setup.row_index, seed=setup.seed, sampling_seed=setup.sampling_seed,
            budgets=setup.budgets, sampling=self.sampling,
        )  # fmt: skip
        try:
            await episode.reset()
            for generation in turns:
                await episode.commit(generation)
        except BaseException:  # cancelled: the env is released, the session keeps what it had
            await env.aclose()
            raise
        return episode

    def _require_open(self) -> Episode:
        if self.episode is None or self.episode.done:
            raise ValueError("the episode is over; `rewind K` to go back to turn K, or `save PATH`")
        return self.episode

    async def _commit(self, generation: Generation | None) -> Turn | None:
        return await _uninterruptible(self._commit_now(generation))

    async def _commit_now(self, generation: Generation | None) -> Turn | None:
        turn = await self.episode.commit(generation)
        if generation is not None and turn is not None:
            self.committed.append(generation)
        self.candidates = []
        return turn

    async def step(self) -> Turn | None:
        """The policy samples the next turn and it is committed."""
        episode = self._require_open()
        return await self._commit(await episode.generate(self.sampling))

    async def sample(self, k: int) -> list[Candidate]:
        """k samples of the current turn, each with its own seed, each tried on a fresh env.

        None is committed until `pick`.
        """
        if k < 1:
            raise ValueError(f"sample needs k >= 1, got {k}")
        episode = self._require_open()
        self.candidates = []
        base = self.setup.sampling_seed + 1000 * (len(episode.trajectory.turns) + 1)
        generations = []
        for i in range(k):
            generation = await episode.generate(self.sampling, seed=base + i)
            if generation is None:  # the engine failed: the episode recorded engine_error
                break
            generations.append(generation)
        self.candidates = list(await asyncio.gather(*map(self._try, generations)))
        return self.candidates

    async def _try(self, generation: Generation) -> Candidate:
        """Commit `generation` on a fresh episode that replayed the committed turns."""
        episode = await self._fresh_episode(self.committed)
        try:
            turn = await episode.commit(generation)
        finally:
            await episode.env.aclose()
        trajectory = episode.trajectory
        status = trajectory.status.value if episode.done else RUNNING
        if turn is None:  # the env failed on it
            return Candidate(
                generation, generation.finish_reason.value, None, status, {"error": trajectory.error}
            )
        return Candidate(generation, turn.finish_reason, turn.reward, status, dict(trajectory.info))

    async def pick(self, index: int) -> Turn | None:
        if not self.candidates:
            raise ValueError("no samples to pick from: run `sample K` first")
        if not 0 <= index < len(self.candidates):
            raise ValueError(f"pick needs one of 0..{len(self.candidates) - 1}, got {index}")
        self._require_open()
        return await self._commit(self.candidates[index].generation)

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
        await self._restart(self.committed[: turn - 1])

    def set_temperature(self, temperature: float) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (sampling, as in training), got {temperature}")
        self.sampling = dataclasses.replace(self.sampling, temperature=temperature)

    def save(self, path: Path) -> Trajectory:
        """Append the episode as one JSONL line, the format training dumps in rollouts/step_N.jsonl.

        An episode the env has not ended is saved as training records one cut at this many turns
        (`truncated_turns`, its last observation left out, `info["truncation"]` saying so); the live
        episode goes on.
        """
        saved = Trajectory.from_json(self.episode.trajectory.to_json())  # a copy
        if not self.episode.done:
            saved.status = Status.TRUNCATED_TURNS
            saved.info["truncation"] = (
                f"saved by the debugger after {len(saved.turns)} turn(s), before the env ended the episode"
            )
            saved.drop_unanswered_observation()  # the observation no turn answered
            if saved.turns:
                saved.turns[-1].observation_ids = []
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            handle.write(json.dumps(saved.to_json()) + "\n")
        return saved

    async def close(self) -> None:
        if self.env is not None:
            await self.env.aclose()


async def _uninterruptible(awaitable: Awaitable) -> Any:
    """Await to the end even if the caller is cancelled meanwhile; the cancellation is raised after."""
    task = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise
