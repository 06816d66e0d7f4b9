"""Chat-template pre-flight: does a tokenizer's template keep the tokens training relies on?

`python -m agentrl.check_template MODEL_PATH [--tools]` replays generated multi-turn
conversations through `agentrl.rollout.chat_template.ChatTemplate` exactly as the agent loop
does and exits non-zero on the first token that a full re-render disagrees with, or when the
template renders the same messages differently twice. Tool calls are replayed whenever the
template renders tools.
"""

from agentrl.check_template.checks import (
    TemplateReport,
    Violation,
    check_template,
    renders_tools,
    template_facts,
)
from agentrl.check_template.conversations import Conversation, conversations

__all__ = [
    "Conversation",
    "TemplateReport",
    "Violation",
    "check_template",
    "conversations",
    "renders_tools",
    "template_facts",
]
