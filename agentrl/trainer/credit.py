"""Advantage stage, turn level: from trajectories to one advantage per sampled token.

An episode's turns are its blocks of sampled tokens, in order: turn t's block is its
`completion_ids`. A turn's reward is what the env returned for it; whatever the episode's
reward adds on top of the sum of those (reward functions, the overlong penalty: outcome-level
shaping) belongs to the last turn, so the turn rewards always sum to the episode's reward. A
block the env never answered (the episode was cut while stepping it) is one more turn with
reward 0. The tensor math is `agentrl.algorithms.turn_credit`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentrl.algorithms.config import AlgorithmConfig
from agentrl.algorithms.turn_credit import spread_over_tokens, turn_advantages
from agentrl.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class TurnBlocks:
    """The turns of one episode as credit sees them."""

    rewards: list[float]  # [num_turns] sums to the episode's reward
    lengths: list[int]  # [num_turns] sampled tokens of each turn


def turn_blocks(trajectory: Trajectory) -> TurnBlocks:
    """Each turn's reward and number of sampled tokens (see the module docstring)."""
    rewards = [turn.reward for turn in trajectory.turns]
    lengths = [len(turn.completion_ids) for turn in trajectory.turns]
    num_sampled = sum(sum(sample.loss_mask) for sample in trajectory.samples())
    unanswered = num_sampled - sum(lengths)
    assert unanswered >= 0, f"the turns hold {sum(lengths)} sampled tokens, the samples {num_sampled}"
    if unanswered or not rewards:
        rewards.append(0.0)
        lengths.append(unanswered)
    rewards[-1] = trajectory.reward - sum(rewards[:-1])  # exactly the episode's reward for one turn
    return TurnBlocks(rewards, lengths)


def token_advantages(
    config: AlgorithmConfig,
    trajectories: Sequence[Trajectory],
    group_ids: torch.Tensor,  # [N]
    valid: torch.Tensor,  # [N] bool
) -> list[list[float]]:
    """Per trajectory, one advantage per sampled token in sampling order (its turn's advantage)."""
    blocks = [turn_blocks(trajectory) for trajectory in trajectories]
    max_turns = max((len(block.rewards) for block in blocks), default=0)
    rewards = torch.zeros(len(blocks), max_turns, dtype=torch.float64)
    mask = torch.zeros(len(blocks), max_turns, dtype=torch.bool)
    for row, block in enumerate(blocks):
        rewards[row, : len(block.rewards)] = torch.tensor(block.rewards, dtype=torch.float64)
        mask[row, : len(block.rewards)] = True
    advantages = turn_advantages(config, rewards, mask, group_ids, valid)
    return [
        spread_over_tokens(advantages[row, : len(block.rewards)].tolist(), block.lengths)
        for row, block in enumerate(blocks)
    ]
