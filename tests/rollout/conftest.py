"""Fixtures: the bundled tiny policy's real tokenizer and chat template."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from agentrl.rollout.chat_template import ChatTemplate
from agentrl.tiny_policy import DEFAULT_MODEL_PATH


@pytest.fixture(scope="session")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)


@pytest.fixture
def template(tokenizer):
    return ChatTemplate(tokenizer)
