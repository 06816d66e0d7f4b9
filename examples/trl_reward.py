"""Reward functions written for TRL's GRPOTrainer, used here unchanged.

Each function gets the batch as TRL passes it: `completions` (conversational, so each one is a
list of messages), `prompts`, `completion_ids`, and every dataset column as a keyword
argument (here the math rows' `reward_model`). Returning None means "not applicable": the
sample's other rewards still count, as with TRL's weighted nansum.

    python -m agentrl.train env=math \
        reward.funcs=[examples.trl_reward:correct_answer,examples.trl_reward:short_working] \
        reward.weights=[1.0,0.2] trainer.total_training_steps=2
"""

import re

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def correct_answer(completions, reward_model, **kwargs):
    """1.0 when the last boxed answer equals the ground truth as a number, else 0.0."""
    rewards = []
    for completion, truth in zip(completions, reward_model):
        answers = BOXED.findall(completion[-1]["content"])
        rewards.append(float(bool(answers) and answers[-1].strip() == truth["ground_truth"]))
    return rewards


def short_working(completions, completion_ids, **kwargs):
    """A bonus for short replies, only for replies that give a boxed answer (None otherwise)."""
    rewards = []
    for completion, ids in zip(completions, completion_ids):
        if not BOXED.search(completion[-1]["content"]):
            rewards.append(None)  # no answer to judge the working of: not applicable
        else:
            rewards.append(max(0.0, 1.0 - len(ids) / 48))
    return rewards
