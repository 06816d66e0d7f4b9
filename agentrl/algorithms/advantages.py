"""Advantage stage: one scalar per trajectory from the rewards of its group (GRPO, Dr.GRPO, RLOO).

Every trajectory of a group answers the same prompt; its advantage is its outcome reward
compared with the other members of the group. Trajectories marked invalid (error statuses:
the env, engine or sandbox failed) are neither compared against nor trained on: they are
left out of every group statistic and get advantage 0. The training batch broadcasts each
trajectory's advantage to all of its response tokens.
"""

from __future__ import annotations

import torch

from agentrl.algorithms.config import AlgorithmConfig


def _check_shapes(rewards: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor) -> None:
    if rewards.dim() != 1 or rewards.shape != group_ids.shape or rewards.shape != valid.shape:
        raise ValueError(
            "rewards, group_ids and valid must be 1-D tensors of one length, got shapes "
            f"{tuple(rewards.shape)}, {tuple(group_ids.shape)}, {tuple(valid.shape)}"
        )


def _group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense group index [N] in 0..num_groups-1, and num_groups."""
    _, index = torch.unique(group_ids, return_inverse=True)
    return index, int(index.max().item()) + 1 if index.numel() else 0


def _group_sums(values: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, index, values)


def _has_spread(
    rewards: torch.Tensor, valid: torch.Tensor, index: torch.Tensor, num_groups: int
) -> torch.Tensor:
    """[N] True where the valid members of the trajectory's group do not all share one reward.

    Decided by comparing rewards, not by a computed std: the mean of equal rewards is not exactly
    that reward in floating point, and the rounding error divided by a tiny std is not small.
    """
    empty = torch.full((num_groups,), float("nan"), dtype=rewards.dtype, device=rewards.device)
    highest = empty.clone().scatter_reduce_(0, index[valid], rewards[valid], "amax", include_self=False)
    lowest = empty.clone().scatter_reduce_(0, index[valid], rewards[valid], "amin", include_self=False)
    return (highest > lowest)[index]


def grpo_advantages(
    rewards: torch.Tensor,  # [N]
    group_ids: torch.Tensor,  # [N]
    valid: torch.Tensor,  # [N] bool
    norm_by_std: bool,
    eps: float = 1e-6,
) -> torch.Tensor:  # [N]
    """GRPO: A_i = (r_i - mean_g) / (std_g + eps); Dr.GRPO (norm_by_std=False): A_i = r_i - mean_g.

    mean_g and std_g are over the valid members of i's group; std is the unbiased (n - 1)
    sample std, as in verl. Statistics are taken in float64, and a group whose valid rewards are
    all equal (or that has a single valid member) gets advantages of exactly 0.
    """
    _check_shapes(rewards, group_ids, valid)
    rewards = rewards.to(torch.float64)
    weights = valid.to(torch.float64)
    index, num_groups = _group_index(group_ids)
    counts = _group_sums(weights, index, num_groups)
    means = _group_sums(rewards * weights, index, num_groups) / counts.clamp(min=1)
    centered = (rewards - means[index]) * weights
    if norm_by_std:
        squares = _group_sums(centered.square(), index, num_groups)
        stds = (squares / (counts - 1).clamp(min=1)).sqrt()
        centered = centered / (stds[index] + eps)
    informative = _has_spread(rewards, valid, index, num_groups) & valid
    return torch.where(informative, centered, torch.zeros_like(centered)).to(torch.float32)


def rloo_advantages(
    rewards: torch.Tensor,  # [N]
    group_ids: torch.Tensor,  # [N]
    valid: torch.Tensor,  # [N] bool
) -> torch.Tensor:  # [N]
    """RLOO: A_i = r_i - mean of the other valid members of i's group = n/(n-1) * (r_i - mean_g).

    Taken in float64; a group with a single valid member, or whose valid rewards are all equal,
    gets advantages of exactly 0.
    """
    _check_shapes(rewards, group_ids, valid)
    rewards = rewards.to(torch.float64)
    weights = valid.to(torch.float64)
    index, num_groups = _group_index(group_ids)
    counts = _group_sums(weights, index, num_groups)
    totals = _group_sums(rewards * weights, index, num_groups)
    others = (counts[index] - 1).clamp(min=1)
    baseline = (totals[index] - rewards) / others
    informative = (counts[index] > 1) & valid & _has_spread(rewards, valid, index, num_groups)
    return torch.where(informative, rewards - baseline, torch.zeros_like(rewards)).to(torch.float32)


def compute_advantages(
    config: AlgorithmConfig,
    rewards: torch.Tensor,  # [N]
    group_ids: torch.Tensor,  # [N]
    valid: torch.Tensor,  # [N] bool
) -> torch.Tensor:  # [N]
    """Advantages with the estimator `config.adv_estimator` names."""
    if config.adv_estimator == "grpo":
        return grpo_advantages(rewards, group_ids, valid, norm_by_std=config.norm_adv_by_std_in_grpo)
    if config.adv_estimator == "rloo":
        return rloo_advantages(rewards, group_ids, valid)
    raise ValueError(f"adv_estimator must be 'grpo' or 'rloo', got {config.adv_estimator!r}")


def zero_spread_groups(
    rewards: torch.Tensor,  # [N]
    group_ids: torch.Tensor,  # [N]
    valid: torch.Tensor,  # [N] bool
) -> set[int]:
    """Group ids whose valid rewards are all equal (or that have fewer than two valid members).

    Such groups give every member advantage 0, so they carry no learning signal; DAPO's
    dynamic sampling drops them and samples more prompts.
    """
    _check_shapes(rewards, group_ids, valid)
    informative: set[int] = set()
    for group in torch.unique(group_ids).tolist():
        members = rewards[(group_ids == group) & valid]
        if members.numel() >= 2 and bool((members != members[0]).any()):
            informative.add(int(group))
    return {int(group) for group in torch.unique(group_ids).tolist()} - informative
