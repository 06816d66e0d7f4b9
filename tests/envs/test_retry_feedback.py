"""The retry message has one home, the math env; the tiny policy and check_template use the same text."""

import random

from agentrl.check_template import conversations
from agentrl.testing import play_sync
from envs.math import FEEDBACK, MathEnv
from envs.tiny_policy.corpus import make_math_conversation

ROW = {
    "data_source": "test",
    "prompt": [{"role": "user", "content": "What is 2 + 3? Put the final answer in \\boxed{}."}],
    "reward_model": {"ground_truth": "5"},
}


def test_the_math_env_asks_for_a_retry_with_the_text_the_tiny_policy_was_trained_on():
    # The bundled policy learned to retry after exactly these bytes; it is not rebuilt with the code.
    [first, _] = play_sync(MathEnv(max_attempts=2), ["\\boxed{4}", "\\boxed{5}"], row=ROW).steps
    assert first.observation == [{"role": "user", "content": "Your answer is incorrect. Try again."}]
    retry = make_math_conversation(random.Random(1), index=0, retry=True)
    assert retry.messages[2] == first.observation[0]


def test_check_template_checks_the_retry_turn_the_math_env_sends():
    # The core may not import envs/, so check_template spells the message out; this ties the two.
    [conversation] = [c for c in conversations(with_tools=False) if c.name == "system_and_retry"]
    assert [m["content"] for m in conversation.messages if m["role"] == "user"][1] == FEEDBACK
