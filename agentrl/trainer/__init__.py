"""Training: padded batches, the FSDP2 policy worker, its settings and atomic checkpoints.

Import the submodules directly (`agentrl.trainer.policy_worker`, ...): this package stays light
so that the config schema can import `agentrl.trainer.actor_config` without loading torch.
"""
