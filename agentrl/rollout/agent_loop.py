"""Rollout stage: one asyncio task steps one environment with the engine, token in, token out.

Model tokens are appended exactly as sampled (loss mask 1, with their rollout logprobs);
observation tokens are the chat template's delta (loss mask 0). Every budget truncates with a
named status; an env or engine failure becomes an error-status trajectory, never a crash.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from agentrl.engine.protocol import FinishReason, InferenceEngine, SamplingParams
from agentrl.env.base import TextEnv
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.trajectory import Status, Trajectory, Turn


@dataclass(frozen=True)
class Budgets:
    """Limits on one episode; exceeding any of them truncates it with a named status."""

    max_turns: int
    max_new_tokens_per_turn: int
    max_tokens_per_episode: int  # prompt + response
    step_timeout_s: float  # one env reset/step call
    episode_timeout_s: float  # the whole episode


@dataclass(frozen=True)
class Sampling:
    """Per-turn sampling settings (the token budget comes from Budgets)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1


class EnvFailure(Exception):
    """The environment raised; wraps the original exception."""


class EngineFailure(Exception):
    """The inference engine raised; wraps the original exception."""


class StepTimeout(Exception):
    """One env call ran past rollout.step_timeout_s."""


async def _env_call(coroutine, timeout_s: float):
    try:
        return await asyncio.wait_for(coroutine, timeout_s)
    except TimeoutError as exc:
        raise StepTimeout(f"env call exceeded step_timeout_s={timeout_s}") from exc
    except Exception as exc:
        raise EnvFailure(f"{type(exc).__name__}: {exc}") from exc


async def _episode(
    env: TextEnv,
    engine: InferenceEngine,
    template: ChatTemplate,
    trajectory: Trajectory,
    row: dict[str, Any],
    seed: int,
    budgets: Budgets,
    sampling: Sampling,
    sampling_seed: int,
) -> None:
    """Fill `trajectory` in place, so a timeout keeps every turn completed so far."""
    messages, _ = await _env_call(env.areset(seed=seed, options=row), budgets.step_timeout_s)
    trajectory.prompt_ids = template.prompt_ids(messages, env.tools)
    history = list(messages)
    for turn_index in range(budgets.max_turns):
        room = budgets.max_tokens_per_episode - len(trajectory.prompt_ids) - len(trajectory.response_ids)
        if room <= 0:
            trajectory.status = Status.TRUNCATED_TOKENS
            return
        params = SamplingParams(
            max_new_tokens=min(budgets.max_new_tokens_per_turn, room),
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            seed=sampling_seed + turn_index,
        )
        try:
            generation = await engine.generate(trajectory.prompt_ids + trajectory.response_ids, params)
        except Exception as exc:
            raise EngineFailure(f"{type(exc).__name__}: {exc}") from exc
        trajectory.policy_version = generation.policy_version
        trajectory.response_ids += generation.completion_ids
        trajectory.loss_mask += [1] * len(generation.completion_ids)
        trajectory.rollout_logprobs += generation.logprobs
        text = template.tokenizer.decode(generation.completion_ids, skip_special_tokens=True)
        observation, reward, terminated, truncated, info = await _env_call(
            env.astep(text), budgets.step_timeout_s
        )
        turn = Turn(
            text, generation.completion_ids, observation, [], float(reward), generation.finish_reason.value
        )
        trajectory.turns.append(turn)
        trajectory.reward += float(reward)
        trajectory.info.update(info)
        if terminated or truncated:
            trajectory.status = Status.COMPLETED if terminated else Status.TRUNCATED_ENV
            return
        if generation.finish_reason is FinishReason.LENGTH and params.max_new_tokens == room:
            trajectory.status = Status.TRUNCATED_TOKENS
            return
        history.append({"role": "assistant", "content": text})
        delta = template.observation_delta(history, generation.completion_ids, observation, env.tools)
        trajectory.num_template_mismatches += not delta.prefix_ok
        turn.observation_ids = delta.token_ids
        history += observation
        trajectory.response_ids += delta.token_ids
        trajectory.loss_mask += [0] * len(delta.token_ids)
        trajectory.rollout_logprobs += [0.0] * len(delta.token_ids)
    trajectory.status = Status.TRUNCATED_TURNS


async def run_episode(
    env: TextEnv,
    engine: InferenceEngine,
    template: ChatTemplate,
    row: dict[str, Any],
    *,
    group_id: int,
    seed: int,
    sampling_seed: int,
    budgets: Budgets,
    sampling: Sampling,
) -> Trajectory:
    """Roll out one episode of `env` on task `row`; never raises for env or engine failures."""
    trajectory = Trajectory(group_id=group_id, prompt_ids=[])
    try:
        await asyncio.wait_for(
            _episode(env, engine, template, trajectory, row, seed, budgets, sampling, sampling_seed),
            budgets.episode_timeout_s,
        )
    except TimeoutError:
        trajectory.status = Status.TRUNCATED_TIME
        trajectory.info["timeout"] = f"episode exceeded episode_timeout_s={budgets.episode_timeout_s}"
    except StepTimeout as exc:
        trajectory.status = Status.TRUNCATED_TIME
        trajectory.info["timeout"] = str(exc)
    except EnvFailure as exc:
        trajectory.status, trajectory.error = Status.ENV_ERROR, str(exc)
    except EngineFailure as exc:
        trajectory.status, trajectory.error = Status.ENGINE_ERROR, str(exc)
    _drop_dangling_observation(trajectory)
    return trajectory


def _drop_dangling_observation(trajectory: Trajectory) -> None:
    """A response must end on a sampled token: trailing observation tokens carry no signal."""
    while trajectory.loss_mask and trajectory.loss_mask[-1] == 0:
        trajectory.loss_mask.pop()
        trajectory.response_ids.pop()
        trajectory.rollout_logprobs.pop()
