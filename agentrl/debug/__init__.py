"""Interactive rollout debugger: `python -m agentrl.debug env=NAME [overrides] [options]`.

Steps one episode turn by turn on the agent loop's own `Episode` API, with the model or a
person as the policy, shows each turn's messages, tokens (loss mask, logprobs), reward,
status and budgets, and replays recorded trajectories against a fresh re-render.
"""
