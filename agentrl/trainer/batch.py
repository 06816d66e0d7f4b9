"""Batch stage: trajectories become padded tensors the policy worker trains on.

Each row is one sample of an episode (`Trajectory.samples()`: one, or several when the episode's
history was rewritten): its prompt_ids + response_ids, right padded to the longest row. Every
sample of an episode carries the episode's advantage and its index (`episode_ids`), so the loss
can count the episode once (agentrl.algorithms.aggregation). All per-token
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

from agentrl.rollout.trajectory import Segment, Trajectory


@dataclass
class TrainBatch:
    """Padded tensors of B sequences (samples) of length T (prompt + response)."""

    input_ids: torch.Tensor  # [B, T] int64, right padded with pad_token_id
    attention_mask: torch.Tensor  # [B, T] int64, 1 on real tokens
    position_ids: torch.Tensor  # [B, T] int64, 0..T-1
    loss_mask: torch.Tensor  # [B, T] float32, 1 on tokens the policy sampled
    advantages: torch.Tensor  # [B, T] float32, the sequence's advantage where loss_mask is 1, else 0
    rollout_logprobs: torch.Tensor  # [B, T] float32, engine's logprob of each sampled token, else 0
    group_ids: torch.Tensor  # [B] int64, prompt (dataset row) of each sequence
    episode_ids: torch.Tensor  # [B] int64, episode of each sequence; the samples of one episode share it
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


def _check_sample(where: str, sample: Segment) -> None:
    num_response = len(sample.response_ids)
    if len(sample.loss_mask) != num_response or len(sample.rollout_logprobs) != num_response:
        raise ValueError(
            f"{where}: response_ids, loss_mask and rollout_logprobs must have one length, got "
            f"{num_response}, {len(sample.loss_mask)}, {len(sample.rollout_logprobs)}"
        )
    if not sample.prompt_ids:
        raise ValueError(f"{where} has no prompt_ids: its first response token cannot be predicted")


def build_train_batch(
    trajectories: Sequence[Trajectory],
    advantages: torch.Tensor,  # [N] one per trajectory, same order
    pad_token_id: int,
    token_advantages: Sequence[list[float]] | None = None,
) -> TrainBatch:
    """Pad the samples of the non-error trajectories into a TrainBatch, one row per sample.

    Error-status trajectories never reach the loss. A row's episode id is its trajectory's index
    in `trajectories`. `token_advantages` (turn-level credit) replaces the broadcast of
    `advantages`: per trajectory, one value per sampled token (loss mask 1) in sampling order,
    over all its samples.
    """
    if advantages.shape != (len(trajectories),):
        raise ValueError(
            f"advantages must have shape [{len(trajectories)}] (one per trajectory), got {tuple(advantages.shape)}"
        )
    kept = [i for i, trajectory in enumerate(trajectories) if not trajectory.status.is_error]
    if not kept:
        raise ValueError("every trajectory has an error status; there is nothing to train on")
    rows: list[tuple[int, Segment]] = []  # (episode index, sample)
    for i in kept:
        samples = trajectories[i].samples()
        for number, sample in enumerate(samples):
            where = f"trajectory {i}" if len(samples) == 1 else f"trajectory {i} sample {number}"
            _check_sample(where, sample)
            rows.append((i, sample))
    length = max(len(sample.prompt_ids) + len(sample.response_ids) for _, sample in rows)
    shape = (len(rows), length)
    input_ids = torch.full(shape, pad_token_id, dtype=torch.int64)
    attention_mask = torch.zeros(shape, dtype=torch.int64)
    loss_mask = torch.zeros(shape, dtype=torch.float32)
    rollout_logprobs = torch.zeros(shape, dtype=torch.float32)
    for row, (_, sample) in enumerate(rows):
        start, end = len(sample.prompt_ids), len(sample.prompt_ids) + len(sample.response_ids)
        input_ids[row, :end] = torch.tensor(sample.prompt_ids + sample.response_ids, dtype=torch.int64)
        attention_mask[row, :end] = 1
        loss_mask[row, start:end] = torch.tensor(sample.loss_mask, dtype=torch.float32)
        rollout_logprobs[row, start:end] = torch.tensor(sample.rollout_logprobs, dtype=torch.float32)
    episode_ids = torch.tensor([i for i, _ in rows], dtype=torch.int64)
    # Every sample of an episode trains with the episode's advantage.
    row_advantages = advantages.to(torch.float32)[episode_ids]
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=torch.arange(length, dtype=torch.int64).expand(shape).clone(),
        loss_mask=loss_mask,
        advantages=row_advantages[:, None] * loss_mask
        if token_advantages is None
        else _on_sampled_tokens(loss_mask, episode_ids, token_advantages),
        rollout_logprobs=rollout_logprobs * loss_mask,
        group_ids=torch.tensor([trajectories[i].group_id for i, _ in rows], dtype=torch.int64),
        episode_ids=episode_ids,
    )


def _on_sampled_tokens(
    loss_mask: torch.Tensor,  # [B, T]
    episode_ids: torch.Tensor,  # [B]
    values: Sequence[list[float]],  # [N][sampled tokens of episode n, over its samples in order]
) -> torch.Tensor:  # [B, T] float32: each episode's values in order on its rows' mask-1 positions
    num_sampled = [0] * len(values)
    for row, episode in enumerate(episode_ids.tolist()):
        num_sampled[episode] += int(loss_mask[row].sum())
    for episode in set(episode_ids.tolist()):
        if num_sampled[episode] != len(values[episode]):
            raise ValueError(
                f"trajectory {episode} has {num_sampled[episode]} sampled tokens but "
                f"{len(values[episode])} token advantages"
            )
    result = torch.zeros_like(loss_mask)
    used = [0] * len(values)
    for row, episode in enumerate(episode_ids.tolist()):
        sampled = loss_mask[row].bool()
        start, used[episode] = used[episode], used[episode] + int(sampled.sum())
        result[row, sampled] = torch.tensor(values[episode][start : used[episode]], dtype=torch.float32)
    return result
