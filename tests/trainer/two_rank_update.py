"""Run one PPO update of the tiny model on a fixed batch and save the metrics and new weights.

Launched both as `python two_rank_update.py MODEL OUT` (one rank) and under
`torchrun --nproc_per_node=2` (two ranks); the two outputs must agree.
"""

from __future__ import annotations

import sys

import torch

from agentrl.rollout.trajectory import Status
from agentrl.trainer.actor_config import ActorConfig
from agentrl.trainer.batch import build_train_batch
from agentrl.trainer.distributed import exit_rank
from agentrl.trainer.policy_worker import PolicyWorker
from tests.trainer.tiny_model import PAD_TOKEN_ID, short_trajectory, two_turn_trajectory


def fixed_batch():
    """Three groups; one error trajectory is dropped, so 5 sequences do not split evenly over 2 ranks."""
    trajectories = [
        two_turn_trajectory(group_id=0),
        short_trajectory(0, [4, 9, 1]),
        short_trajectory(1, [5, 5]),
        short_trajectory(1, [6], Status.SANDBOX_ERROR),
        short_trajectory(2, [7, 8, 9, 10]),
        short_trajectory(2, [11]),
    ]
    advantages = torch.tensor([1.0, -1.0, 0.5, 3.0, -0.5, 0.25])
    return build_train_batch(trajectories, advantages, PAD_TOKEN_ID)


def main(model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    actor = ActorConfig(
        ppo_mini_batch_size=3,
        ppo_micro_batch_size_per_gpu=2,
        loss_agg_mode="seq-mean-token-mean",
        use_kl_loss=True,
        entropy_coeff=0.01,
        optim={"lr": 1e-2},
    )
    worker = PolicyWorker(model_dir, actor, "cpu")
    batch = fixed_batch()
    batch.old_logprobs, _ = worker.compute_logprobs(batch)
    batch.ref_logprobs = batch.old_logprobs - 0.1
    metrics = worker.update(batch)
    logprobs_after, _ = worker.compute_logprobs(batch)
    state = worker.full_state_dict()
    if worker.context.is_main:
        torch.save({"metrics": metrics, "state": state, "logprobs": logprobs_after}, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
    exit_rank(0)
