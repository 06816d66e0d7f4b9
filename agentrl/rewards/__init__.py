"""Reward stage: TRL- and verl-style reward functions named in the config's `reward` section.

`RewardFunctions.from_config(config.reward)` imports them once; `.apply(trajectories, rows)`
sets each episode's reward after rollout and returns `reward/<name>/mean` and `/std`.
Ready-made functions are in `agentrl.rewards.builtin`.
"""

from agentrl.rewards.apply import RewardFunctions, apply_reward_functions
from agentrl.rewards.calls import completion_messages, num_turns, solution_text
from agentrl.rewards.config import CustomRewardFunction, RewardConfig

__all__ = [
    "CustomRewardFunction",
    "RewardConfig",
    "RewardFunctions",
    "apply_reward_functions",
    "completion_messages",
    "num_turns",
    "solution_text",
]
