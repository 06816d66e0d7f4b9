"""Training: padded batches, the FSDP2 policy worker, its settings and atomic checkpoints."""

from agentrl.trainer.actor_config import ActorConfig, OptimConfig
from agentrl.trainer.batch import TrainBatch, build_train_batch
from agentrl.trainer.checkpoint import checkpoint_steps, load_latest_checkpoint, save_checkpoint
from agentrl.trainer.distributed import DistributedContext, init_distributed
from agentrl.trainer.policy_worker import PolicyWorker

__all__ = [
    "ActorConfig",
    "DistributedContext",
    "OptimConfig",
    "PolicyWorker",
    "TrainBatch",
    "build_train_batch",
    "checkpoint_steps",
    "init_distributed",
    "load_latest_checkpoint",
    "save_checkpoint",
]
