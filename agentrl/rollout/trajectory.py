"""Rollout stage output: one episode as the exact tokens the policy saw and produced."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """How an episode ended. Truncation is not an error; an error is not a wrong answer."""

    COMPLETED = "completed"  # the env said terminated
    TRUNCATED_ENV = "truncated_env"  # the env said truncated
    TRUNCATED_TURNS = "truncated_turns"  # rollout.max_turns reached
    TRUNCATED_TOKENS = "truncated_tokens"  # episode token budget (or context) exhausted
    TRUNCATED_TIME = "truncated_time"  # per-step or per-episode timeout
    # An observation over rollout.max_observation_tokens: a budget, so trainable like truncated_tokens.
    TRUNCATED_OBSERVATION = "truncated_observation"
    ENV_ERROR = "env_error"  # the env raised, returned a malformed value, or blocked its event loop
    ENGINE_ERROR = "engine_error"  # the inference engine raised
    SANDBOX_ERROR = "sandbox_error"  # the sandbox failed (not the program)
    AGENT_ERROR = "agent_error"  # an agent program (env=agent) raised or gave no reward

    @property
    def is_error(self) -> bool:
        return self in (Status.ENV_ERROR, Status.ENGINE_ERROR, Status.SANDBOX_ERROR, Status.AGENT_ERROR)

    @property
    def is_truncated(self) -> bool:
        return self.value.startswith("truncated")


@dataclass
class Turn:
    """One assistant turn and the environment's answer to it."""

    action_text: str  # decoded completion, for humans; training uses the ids
    completion_ids: list[int]  # [num_completion_tokens]
    observation: list[dict[str, Any]]  # messages the env returned
    observation_ids: list[int]  # [num_observation_tokens] template delta, loss mask 0
    reward: float
    finish_reason: str
    policy_version: int = 0  # weight version that sampled this turn
    # The context after this turn does not extend the sample it was sampled in (the template or the
    # env rewrote history, or trajectory_mode=segments): the next turn is sampled in a new sample.
    starts_new_sample: bool = False
    # The conversation the env replaced the history with at this step (info["history"]), if it did.
    rewritten_history: list[dict[str, Any]] | None = None


@dataclass
class Segment:
    """One trained sample of an episode: a context and the tokens that followed it."""

    prompt_ids: list[int]  # [num_prompt_tokens]
    response_ids: list[int]  # [num_response_tokens]
    loss_mask: list[int]  # [num_response_tokens] 1 on sampled tokens
    rollout_logprobs: list[float]  # [num_response_tokens] 0 where mask is 0
    # [num_response_tokens] weight version that sampled each token, 0 where mask is 0; empty in
    # records written before it was kept (`Trajectory.sampled_versions` falls back to the turns').
    token_versions: list[int] = field(default_factory=list)


@dataclass
class Trajectory:
    """One episode: prompt ids, then model and observation tokens interleaved.

    When the next context no longer extends what was sampled (a template that rewrites
    earlier turns, an env that compacts its history), the episode continues as a new
    sample: the closed ones are in `earlier_segments`, the live one is prompt_ids,
    response_ids, loss_mask and rollout_logprobs. `samples()` lists them all in order.
    """

    group_id: int  # index of the dataset row; the n trajectories of a row share it
    prompt_ids: list[int]  # [num_prompt_tokens]
    response_ids: list[int] = field(default_factory=list)  # [num_response_tokens]
    loss_mask: list[int] = field(default_factory=list)  # [num_response_tokens] 1 on sampled tokens
    rollout_logprobs: list[float] = field(default_factory=list)  # [num_response_tokens] 0 where mask is 0
    # [num_response_tokens] weight version that sampled each token, 0 where mask is 0. One episode may
    # span several versions: with rollout.partial_rollout its later turns sample from newer weights.
    token_versions: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0  # episode return: sum of turn rewards
    status: Status = Status.COMPLETED
    error: str | None = None  # message of the exception behind an error status
    policy_version: int = 0
    # trajectory_mode=single only: turns whose next context did not extend the sample, so a best-effort
    # delta was appended and the trained tokens differ from the render. Other modes start a new sample.
    num_template_mismatches: int = 0
    num_infra_retries: int = 0  # reruns after engine_error/sandbox_error before this result
    info: dict[str, Any] = field(default_factory=dict)
    advantage: float | None = None  # set by the training loop for trajectories it trains on
    reward_missing: bool = False  # every reward function returned None: out of group statistics (as TRL)
    # Closed samples before the live one, oldest first; empty while the context only appends.
    earlier_segments: list[Segment] = field(default_factory=list)

    def samples(self) -> list[Segment]:
        """Every trained sample of the episode: the earlier segments, then the live one."""
        live = Segment(
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            loss_mask=self.loss_mask,
            rollout_logprobs=self.rollout_logprobs,
            token_versions=self.token_versions,
        )
        return [*self.earlier_segments, live]

    def sampled_versions(self) -> list[int]:
        """The weight version of each sampled token (loss mask 1), over the samples in order.

        A record without per-token versions (written before they were kept, or by a producer that
        does not fill them) gives each turn's completion tokens the turn's version.
        """
        samples = self.samples()
        recorded = any(s.token_versions for s in samples)
        if recorded and all(len(s.token_versions) == len(s.response_ids) for s in samples):
            return [v for s in samples for m, v in zip(s.loss_mask, s.token_versions, strict=True) if m]
        return [turn.policy_version for turn in self.turns for _ in turn.completion_ids]

    def token_versions_by_sample(self) -> list[list[int]]:
        """Per sample, the version of each response token: `sampled_versions` where the mask is 1, else 0."""
        versions = iter(self.sampled_versions())
        return [
            [next(versions, self.policy_version) if m else 0 for m in s.loss_mask] for s in self.samples()
        ]

    # The live sample grows and closes only through these, so its per-token lists stay aligned.

    def append_sampled(self, token_ids: list[int], logprobs: list[float], version: int) -> None:
        """Tokens the policy sampled at weight `version` (loss mask 1)."""
        self.response_ids += token_ids
        self.loss_mask += [1] * len(token_ids)
        self.rollout_logprobs += logprobs
        self.token_versions += [version] * len(token_ids)

    def append_observation(self, token_ids: list[int]) -> None:
        """Tokens the template or the env put after a sampled turn (loss mask 0)."""
        self.response_ids += token_ids
        self.loss_mask += [0] * len(token_ids)
        self.rollout_logprobs += [0.0] * len(token_ids)
        self.token_versions += [0] * len(token_ids)

    def drop_unanswered_observation(self) -> None:
        """Trailing observation tokens no sampled turn follows: a sample ends on a sampled token."""
        while self.loss_mask and self.loss_mask[-1] == 0:
            del self.response_ids[-1], self.loss_mask[-1], self.rollout_logprobs[-1]
            if self.token_versions:
                del self.token_versions[-1]

    def start_sample(self, prompt_ids: list[int]) -> None:
        """Close the live sample (kept if it holds a sampled token) and start one after `prompt_ids`."""
        self.drop_unanswered_observation()
        if any(self.loss_mask):  # a sample without a sampled token trains nothing
            self.earlier_segments.append(
                Segment(
                    self.prompt_ids,
                    self.response_ids,
                    self.loss_mask,
                    self.rollout_logprobs,
                    self.token_versions,
                )
            )
        self.prompt_ids = list(prompt_ids)
        self.response_ids, self.loss_mask, self.rollout_logprobs, self.token_versions = [], [], [], []

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["status"] = self.status.value
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Trajectory:
        """The trajectory `to_json` wrote (one line of rollouts/step_N.jsonl)."""
        fields = dict(record)
        fields["status"] = Status(fields["status"])
        fields["turns"] = [Turn(**turn) for turn in fields.get("turns", [])]
        fields["earlier_segments"] = [Segment(**segment) for segment in fields.get("earlier_segments", [])]
        return cls(**fields)
