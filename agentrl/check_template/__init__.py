"""Chat-template pre-flight: does a tokenizer's template keep the tokens training relies on?

`python -m agentrl.check_template MODEL_PATH [--tools] [--renderer NAME]` replays generated
multi-turn conversations through the model family's renderer (`agentrl.renderers`) exactly as
the agent loop does, and says how the model will train: its family, whether the template
appends or rewrites history (at which turn, dropping what) and the mode
`rollout.trajectory_mode=auto` uses (one sample, or segments). It exits non-zero only for
templates that cannot train (see `checks`). Tool calls are replayed whenever the template
renders tools.
"""

from agentrl.check_template.checks import (
    History,
    HistoryRewrite,
    TemplateReport,
    Violation,
    check_template,
    renders_tools,
    template_facts,
)
from agentrl.check_template.conversations import Conversation, conversations

__all__ = [
    "Conversation",
    "History",
    "HistoryRewrite",
    "TemplateReport",
    "Violation",
    "check_template",
    "conversations",
    "renders_tools",
    "template_facts",
]
