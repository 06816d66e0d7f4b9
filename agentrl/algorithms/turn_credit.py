"""Advantage stage, turn level: one advantage per assistant turn, from the rewards of each turn.

Chosen method: the discounted return-to-go of each turn, compared GRPO-style (or RLOO-style,
as `adv_estimator` says) with the returns of the same group's turns at the same depth:

    G[i, t] = r[i, t] + gamma * r[i, t+1] + gamma^2 * r[i, t+2] + ...      (t-th turn of episode i)
    A[i, t] = estimator(G[i, t] among {G[j, t] : j in group(i), j valid, episode j has a turn t})

Why this and not GiGPO's step groups: GiGPO compares steps that start from the same env state
(an "anchor" observation shared across the group). In text envs whose actions are free-form
replies, states after the first turn almost never repeat between episodes, so step groups
would be singletons and carry no signal. The turns at one depth of one group always exist
together (they answer the same task after the same number of attempts), and for episodes of
one turn this is exactly the episode-level advantage, so turn credit never changes what a
single-turn env trains on. Turns of a depth that only one valid episode reached get
advantage 0, as a group of one does at episode level.

Pure tensor functions; the training loop builds the [N, T] inputs from its trajectories and
gives every sampled token of turn t the advantage A[i, t].
"""

from __future__ import annotations

import torch

from agentrl.algorithms.advantages import compute_advantages
from agentrl.algorithms.config import AlgorithmConfig

RETURN_DECIMALS = 9


def _check_inputs(
    turn_rewards: torch.Tensor, turn_mask: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor
) -> None:
    if turn_rewards.dim() != 2 or turn_mask.shape != turn_rewards.shape:
        raise ValueError(
            "turn_rewards and turn_mask must be 2-D tensors [num_episodes, max_turns] of one shape, got "
            f"{tuple(turn_rewards.shape)} and {tuple(turn_mask.shape)}"
        )
    if group_ids.shape != (turn_rewards.shape[0],) or valid.shape != group_ids.shape:
        raise ValueError(
            f"group_ids and valid must have shape [{turn_rewards.shape[0]}], got "
            f"{tuple(group_ids.shape)} and {tuple(valid.shape)}"
        )
    # An episode's turns are its first num_turns columns: a gap would give two turns one depth.
    if bool((turn_mask[:, 1:] & ~turn_mask[:, :-1]).any()):
        raise ValueError("turn_mask rows must be prefixes: the turns of an episode come first, then padding")


def turn_returns(
    turn_rewards: torch.Tensor,  # [N, T]
    turn_mask: torch.Tensor,  # [N, T] bool, True on the episode's turns (a prefix of each row)
    gamma: float,
) -> torch.Tensor:  # [N, T] float64, 0 on padding
    """Discounted return-to-go of every turn, G[i, t] = sum over s >= t of gamma^(s-t) * r[i, s],
    rounded to RETURN_DECIMALS decimals."""
    rewards = torch.where(turn_mask, turn_rewards.to(torch.float64), 0.0)
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=torch.float64)
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    # Returns that are equal in exact arithmetic but summed from different turn rewards (0.1 + 0.2
    # against 0.3) differ in the last bits, and the estimators compare rewards exactly: rounded to
    # 1e-9, they compare equal.
    return torch.where(turn_mask, torch.round(returns, decimals=RETURN_DECIMALS), 0.0)


def turn_advantages(
    config: AlgorithmConfig,
    turn_rewards: torch.Tensor,  # [N, T]
    turn_mask: torch.Tensor,  # [N, T] bool, prefix per row
    group_ids: torch.Tensor,  # [N]
    valid: torch.Tensor,  # [N] bool
) -> torch.Tensor:  # [N, T] float32, 0 on padding and on invalid episodes
    """Per-turn advantages: each turn's return-to-go (gamma = `config.turn_discount`) compared, with
    `config.adv_estimator`, against the returns of its group's turns at the same depth."""
    _check_inputs(turn_rewards, turn_mask, group_ids, valid)
    turn_mask = turn_mask.bool()
    num_episodes, max_turns = turn_rewards.shape
    result = torch.zeros(num_episodes, max_turns, dtype=torch.float32)
    if num_episodes == 0 or max_turns == 0:
        return result
    returns = turn_returns(turn_rewards, turn_mask, config.turn_discount)
    _, group_index = torch.unique(group_ids, return_inverse=True)
    depth = torch.arange(max_turns).expand(num_episodes, max_turns)
    # One statistics group per (episode group, depth): the existing estimators do the rest.
    keys = group_index[:, None] * max_turns + depth
    turn_valid = valid.bool()[:, None].expand(num_episodes, max_turns)
    present = turn_mask
    result[present] = compute_advantages(config, returns[present], keys[present], turn_valid[present])
    return result


def spread_over_tokens(turn_values: list[float], turn_lengths: list[int]) -> list[float]:
    """One value per sampled token: turn t's value repeated for its `turn_lengths[t]` tokens."""
    if len(turn_values) != len(turn_lengths):
        raise ValueError(f"{len(turn_values)} turn values for {len(turn_lengths)} turns")
    return [value for value, length in zip(turn_values, turn_lengths, strict=True) for _ in range(length)]
