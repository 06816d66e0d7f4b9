"""Evaluation: `python -m agentrl.eval env=NAME model.path=...` scores a policy on the envs it trains on.

pass@k per env and success by turn (pass@turn), with the training run's config, rows, envs and
rollout code, against a checkpoint (the built-in engine) or a served engine.
"""
