"""A reward file written for verl's `custom_reward_function`, used here unchanged.

verl calls `compute_score(data_source, solution_str, ground_truth, extra_info)` once per
sample, with the decoded response as `solution_str`. It may return a number or a dict with a
"score" entry.

    python -m agentrl.train env=math \
        reward.custom_reward_function.path=examples/verl_reward.py \
        reward.custom_reward_function.name=compute_score trainer.total_training_steps=2
"""

import re


def last_boxed(text):
    matches = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return matches[-1].strip() if matches else None


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answer = last_boxed(solution_str)
    if answer is None:
        return {"score": 0.0, "formatted": False}
    return {"score": 1.0 if answer == str(ground_truth) else 0.1, "formatted": True}
