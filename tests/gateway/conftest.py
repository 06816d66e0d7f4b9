"""Fixtures: the tiny policy's tokenizer and renderer, and a gateway in front of a scripted engine."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from agentrl.renderers import build_renderer
from agentrl.rollout.config import Budgets
from agentrl.tiny_policy import DEFAULT_MODEL_PATH

BUDGETS = Budgets(
    max_turns=4,
    max_new_tokens_per_turn=64,
    max_tokens_per_episode=512,
    step_timeout_s=10,
    episode_timeout_s=20,
)
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 * 4"}}\n</tool_call>'
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
QUESTION = {"role": "user", "content": "What is 3 * 4? Put the final answer in \\boxed{}."}


@pytest.fixture(scope="session")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)


@pytest.fixture
def template(tokenizer):
    return build_renderer(tokenizer)


AGENT_ENV = "agentrl.gateway.agent_env:AgentEnv"  # env=agent's id (configs/env/agent.yaml)
