"""Rollout stage settings: group size, sampling, episode budgets and what happens to failures.

`RolloutConfig` is the `rollout` section of the config; the agent loop takes the two values it
builds, `Budgets` and `Sampling`, so each knob has one home and one default.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentrl.env.validation import DEFAULT_REWARD_BOUND


class TrajectoryMode(str, enum.Enum):
    """When an episode continues in a new sample (segment) instead of appending to the live one."""

    AUTO = "auto"  # append while the next context extends the sample's tokens, else start a new sample
    SINGLE = "single"  # never split: a context that does not extend gets a best-effort delta (counted)
    SEGMENTS = "segments"  # a new sample at every turn: each is one full render plus its sampled turn


@dataclass(frozen=True)
class Budgets:
    """Limits on one episode; exceeding any of them truncates it with a named status.

    The token budgets count the live sample (its prompt + response: the context the engine sees
    next) and, when set, the total over every sample of the episode (what the trainer processes).
    """

    max_turns: int
    max_new_tokens_per_turn: int
    max_tokens_per_episode: int  # prompt + response of the live sample
    step_timeout_s: float  # one env call: building it, reset, step, close
    episode_timeout_s: float  # the whole episode
    max_observation_tokens: int = 8192  # one env reply, as template tokens
    reward_bound: float = DEFAULT_REWARD_BOUND  # a step reward outside ±this is an env error
    # Over all samples; None: no cap beyond max_turns * max_tokens_per_episode, which bounds it anyway.
    max_total_tokens_per_episode: int | None = None
    trajectory_mode: TrajectoryMode = TrajectoryMode.AUTO  # not a limit: how the episode's samples are cut


@dataclass(frozen=True)
class Sampling:
    """Per-turn sampling settings (the token budget comes from Budgets)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k filtering


class ValKwargs(BaseModel):
    """Sampling for held-out evaluation (verl's `rollout.val_kwargs`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    temperature: float = Field(0.0, ge=0.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling; < 1 truncates the distribution")
    n: int = Field(1, gt=0, description="samples per held-out prompt")

    def sampling(self) -> Sampling:
        return Sampling(temperature=self.temperature, top_p=self.top_p)


class RolloutConfig(BaseModel):
    """How trajectories are sampled: group size, sampling, budgets and failure handling."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    n: int = Field(8, gt=0, description="trajectories per prompt (group size)")
    temperature: float = Field(1.0, description="sampling temperature for training; must be > 0")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling; < 1 truncates the distribution")
    top_k: int = Field(-1, description="-1 disables top-k; > 0 truncates the distribution")
    max_turns: int = Field(8, gt=0, description="assistant turns per episode (the env usually ends it first)")
    max_new_tokens_per_turn: int = Field(64, gt=0, description="tokens the model may generate in one turn")
    max_tokens_per_episode: int = Field(
        512, gt=0,
        description="prompt + response tokens of an episode's live sample: the context the engine sees, "
        "and one trained row",
    )  # fmt: skip
    max_total_tokens_per_episode: int | None = Field(
        None, gt=0,
        description="prompt + response tokens over all samples of an episode (several when its history is "
        "rewritten); null: no cap beyond max_turns x max_tokens_per_episode",
    )  # fmt: skip
    trajectory_mode: TrajectoryMode = Field(
        TrajectoryMode.AUTO,
        description="auto: an episode appends while the next context extends its tokens and starts a new "
        "sample where it does not (a template or env that rewrites history); segments: a new sample at "
        "every turn; single: never split, and a context that does not extend gets a best-effort delta, "
        "so the trained tokens differ from the render (counted in rollout/template_mismatch_frac)",
    )
    step_timeout_s: float = Field(
        60.0, gt=0, description="limit on one env call (building the env, reset, step, close)"
    )
    episode_timeout_s: float = Field(600.0, gt=0, description="limit on one whole episode")
    max_observation_tokens: int = Field(
        8192, gt=0, description="tokens of one env reply; a longer one ends the episode truncated_observation"
    )
    reward_bound: float = Field(
        DEFAULT_REWARD_BOUND, gt=0, le=1e100,
        description="a reward (env step or reward function) outside [-bound, bound] is that episode's env_error",
    )  # fmt: skip
    max_infra_retries: int = Field(
        2, ge=0, description="reruns (same task and seed) of an episode that ended engine_error/sandbox_error"
    )
    exclude_time_truncated: bool = Field(
        True, description="keep truncated_time episodes (a slow env or engine) out of the loss"
    )
    mode: Literal["sync", "async"] = Field(
        "sync", description="async: generate the next steps' rollouts while the current step trains"
    )
    max_staleness: int = Field(
        1, ge=1,
        description="async: a sample may come from weights at most this many updates old (with "
        "partial_rollout: each sampled token, else each episode's oldest token)",
    )  # fmt: skip
    partial_rollout: bool = Field(
        False,
        description="async: an episode in flight at a weight update samples its next turns from the new "
        "weights and is never generated again for staleness; each token records its version, and a token "
        "older than max_staleness is masked out of the loss",
    )
    val_kwargs: ValKwargs = Field(default_factory=ValKwargs)

    @field_validator("temperature")
    @classmethod
    def _samples(cls, value: float) -> float:
        if value <= 0:
            raise ValueError(
                f"rollout.temperature={value}: training needs sampling (temperature > 0), and the "
                "loss uses logprobs at this temperature; for greedy evaluation set "
                "rollout.val_kwargs.temperature=0"
            )
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k_is_off_or_positive(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError(f"rollout.top_k={value}: use -1 to disable top-k, or a positive k")
        return value

    @model_validator(mode="after")
    def _partial_rollout_is_async(self) -> RolloutConfig:
        if self.partial_rollout and self.mode != "async":
            raise ValueError(
                "rollout.partial_rollout=true continues episodes across weight updates, which only "
                "happen mid-rollout with rollout.mode=async; set rollout.mode=async or drop partial_rollout"
            )
        return self

    def budgets(self) -> Budgets:
        return Budgets(
            max_turns=self.max_turns,
            max_new_tokens_per_turn=self.max_new_tokens_per_turn,
            max_tokens_per_episode=self.max_tokens_per_episode,
            step_timeout_s=self.step_timeout_s,
            episode_timeout_s=self.episode_timeout_s,
            max_observation_tokens=self.max_observation_tokens,
            reward_bound=self.reward_bound,
            max_total_tokens_per_episode=self.max_total_tokens_per_episode,
            trajectory_mode=self.trajectory_mode,
        )

    def sampling(self) -> Sampling:
        return Sampling(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)

    def truncation_warning(self) -> str | None:
        """Why the sampled distribution differs from the one the loss scores, or None."""
        if self.top_p < 1 or self.top_k > 0:
            return (
                f"rollout.top_p={self.top_p}, rollout.top_k={self.top_k} truncate the sampled "
                "distribution: rollout logprobs are of the full softmax, so the behaviour policy "
                "differs from the one the loss assumes"
            )
        return None
