"""Batch stage: trajectories become padded tensors the policy worker trains on.

Every sequence is prompt_ids + response_ids, right padded to the longest one. All per-token
tensors are indexed by the position t of the token in `input_ids` (not of the logit that
predicts it): the model's logits at position t - 1 predict token t, so `logprobs[:, t]` is
log p(input_ids[:, t] | input_ids[:, :t]) and `loss_mask[:, t]` is 1 exactly when token t was
sampled by the policy. Position 0 is never predicted and always has mask 0; prompt,
observation (env) and padding tokens have mask 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentrl.rollout.trajectory import Trajectory


@dataclass
class TrainBatch:
    """Padded tensors of B sequences of length T (prompt + response)."""

    input_ids: torch.Tensor  # [B, T] int64, right padded with pad_token_id
    attention_mask: torch.Tensor  # [B, T] int64, 1 on real tokens
    position_ids: torch.Tensor  # [B, T] int64, 0..T-1
    loss_mask: torch.Tensor  # [B, T] float32, 1 on tokens the policy sampled
    advantages: torch.Tensor  # [B, T] float32, the sequence's advantage where loss_mask is 1, else 0
    rollout_logprobs: torch.Tensor  # [B, T] float32, engine's logprob of each sampled token, else 0
    group_ids: torch.Tensor  # [B] int64, prompt (dataset row) of each sequence
    old_logprobs: torch.Tensor | None = None  # [B, T] float32, policy before this update
    ref_logprobs: torch.Tensor | None = None  # [B, T] float32, frozen reference policy

    @property
    def num_sequences(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def sequence_length(self) -> int:
        return int(self.input_ids.shape[1])

    def select(self, rows: torch.Tensor) -> TrainBatch:
        """The sequences at `rows` (an index tensor [K]), in that order."""
        return TrainBatch(
            **{name: None if value is None else value[rows] for name, value in self.tensors().items()}
        )

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def to(self, device: torch.device | str) -> TrainBatch:
        return TrainBatch(
            **{name: None if value is None else value.to(device) for name, value in self.tensors().items()}
        )


def _check_trajectory(index: int, trajectory: Trajectory) -> None:
    num_response = len(trajectory.response_ids)
    if len(trajectory.loss_mask) != num_response or len(trajectory.rollout_logprobs) != num_response:
        raise ValueError(
            f"trajectory {index}: response_ids, loss_mask and rollout_logprobs must have one length, got "
            f"{num_response}, {len(trajectory.loss_mask)}, {len(trajectory.rollout_logprobs)}"
        )
    if not trajectory.prompt_ids:
        raise ValueError(
            f"trajectory {index} has no prompt_ids: its first response token cannot be predicted"
        )


def build_train_batch(
    trajectories: Sequence[Trajectory],
    advantages: torch.Tensor,  # [N] one per trajectory, same order
    pad_token_id: int,
) -> TrainBatch:
    """Pad the non-error trajectories into a TrainBatch; error-status ones never reach the loss."""
    if advantages.shape != (len(trajectories),):
        raise ValueError(
            f"advantages must have shape [{len(trajectories)}] (one per trajectory), got {tuple(advantages.shape)}"
        )
    kept = [i for i, trajectory in enumerate(trajectories) if not trajectory.status.is_error]
    if not kept:
        raise ValueError("every trajectory has an error status; there is nothing to train on")
    for i in kept:
        _check_trajectory(i, trajectories[i])
    length = max(len(trajectories[i].prompt_ids) + len(trajectories[i].response_ids) for i in kept)
    shape = (len(kept), length)
    input_ids = torch.full(shape, pad_token_id, dtype=torch.int64)
    attention_mask = torch.zeros(shape, dtype=torch.int64)
    loss_mask = torch.zeros(shape, dtype=torch.float32)
    rollout_logprobs = torch.zeros(shape, dtype=torch.float32)
    for row, i in enumerate(kept):
        trajectory = trajectories[i]
        start, end = len(trajectory.prompt_ids), len(trajectory.prompt_ids) + len(trajectory.response_ids)
        input_ids[row, :end] = torch.tensor(
            trajectory.prompt_ids + trajectory.response_ids, dtype=torch.int64
        )
        attention_mask[row, :end] = 1
        loss_mask[row, start:end] = torch.tensor(trajectory.loss_mask, dtype=torch.float32)
        rollout_logprobs[row, start:end] = torch.tensor(trajectory.rollout_logprobs, dtype=torch.float32)
    kept_advantages = advantages.to(torch.float32)[torch.tensor(kept)]
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=torch.arange(length, dtype=torch.int64).expand(shape).clone(),
        loss_mask=loss_mask,
        advantages=kept_advantages[:, None] * loss_mask,
        rollout_logprobs=rollout_logprobs * loss_mask,
        group_ids=torch.tensor([trajectories[i].group_id for i in kept], dtype=torch.int64),
    )
