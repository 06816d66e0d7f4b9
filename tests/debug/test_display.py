"""What the debugger's turn view shows of an episode."""

from __future__ import annotations

import io

from rich.console import Console
from transformers import AutoTokenizer

from agentrl.debug import display
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.config import Budgets
from agentrl.rollout.trajectory import Trajectory, Turn
from agentrl.tiny_policy import DEFAULT_MODEL_PATH

BUDGETS = Budgets(
    max_turns=4, max_new_tokens_per_turn=8, max_tokens_per_episode=64, step_timeout_s=5, episode_timeout_s=10
)


def shown(num_template_mismatches: int) -> str:
    template = ChatTemplate(AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH))
    completion = template.encode("\\boxed{8}") + [2]
    trajectory = Trajectory(
        group_id=0,
        prompt_ids=template.encode("<|im_start|>user\nWhat is 2 * 4?<|im_end|>\n<|im_start|>assistant\n"),
        response_ids=completion,
        loss_mask=[1] * len(completion),
        rollout_logprobs=[-0.5] * len(completion),
        turns=[Turn("\\boxed{8}", completion, [], [], 1.0, "stop")],
        reward=1.0,
        num_template_mismatches=num_template_mismatches,
    )
    messages = [{"role": "user", "content": "What is 2 * 4?"}, {"role": "assistant", "content": "\\boxed{8}"}]
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(display.turn_view(template, trajectory, messages, BUDGETS, True, 0))
    return console.export_text()


def test_the_turn_view_warns_when_the_loop_counted_a_template_mismatch():
    assert (
        "template mismatch: the loop counted 1; the trained tokens differ from a full render of the "
        "conversation (save, then --replay shows where)" in shown(1)
    )
    assert "template mismatch" not in shown(0)
