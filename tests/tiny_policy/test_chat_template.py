"""The shipped chat template: exact ChatML rendering of tools and tool calls, and the prefix property."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from envs.tiny_policy.chat_template import CHAT_TEMPLATE
from envs.tiny_policy.corpus import CALCULATOR_TOOL

TOOLS_SYSTEM_BLOCK = (
    "<|im_start|>system\n# Tools\nYou can call these functions, given as JSON schemas:\n<tools>\n"
    '{"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic '
    'expression.", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, '
    '"required": ["expression"]}}}\n</tools>\nTo call one, reply with <tool_call>\n'
    '{"name": <name>, "arguments": <json object>}\n</tool_call><|im_end|>\n'
)
TOOL_CONVERSATION = [
    {"role": "user", "content": "What is 2 + 3?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}}
        ],
    },
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "\\boxed{5}"},
]
MULTI_TURN = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 7 + 5?"},
    {"role": "assistant", "content": "7 + 5 = 11. \\boxed{11}"},
    {"role": "user", "content": "Your answer is incorrect. Try again."},
    {"role": "assistant", "content": "7 + 5 = 12. \\boxed{12}"},
    {"role": "tool", "content": "first"},
    {"role": "tool", "content": "second"},
    {"role": "assistant", "content": "done"},
]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)


def test_plain_conversation_renders_as_chatml_with_generation_prompt(tokenizer):
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_tools_and_tool_calls_render_exactly(tokenizer):
    text = tokenizer.apply_chat_template(TOOL_CONVERSATION, tools=[CALCULATOR_TOOL], tokenize=False)
    assert text == TOOLS_SYSTEM_BLOCK + (
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n\\boxed{5}<|im_end|>\n"
    )


def test_tool_call_arguments_given_as_json_string_render_verbatim_after_content(tokenizer):
    message = {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [{"function": {"name": "calculator", "arguments": '{"expression": "1 + 1"}'}}],
    }
    text = tokenizer.apply_chat_template([message], tokenize=False)
    assert text == (
        "<|im_start|>assistant\nLet me check.\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "1 + 1"}}\n</tool_call><|im_end|>\n'
    )


def test_system_message_is_merged_into_the_tools_block(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages, tools=[CALCULATOR_TOOL], tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert text.count("<|im_start|>system") == 1


@pytest.mark.parametrize("tools", [None, [CALCULATOR_TOOL]])
@pytest.mark.parametrize("conversation", [TOOL_CONVERSATION, MULTI_TURN])
def test_rendering_a_prefix_of_the_messages_is_a_prefix_of_the_full_rendering(tokenizer, conversation, tools):
    for k in range(1, len(conversation)):
        shorter = tokenizer.apply_chat_template(conversation[:k], tools=tools, tokenize=False)
        longer = tokenizer.apply_chat_template(conversation[: k + 1], tools=tools, tokenize=False)
        assert longer.startswith(shorter)
        if conversation[k]["role"] == "assistant":
            prompt = tokenizer.apply_chat_template(
                conversation[:k], tools=tools, tokenize=False, add_generation_prompt=True
            )
            assert longer.startswith(prompt)


def test_shipped_template_is_the_template_in_the_source(tokenizer):
    assert tokenizer.chat_template == CHAT_TEMPLATE
