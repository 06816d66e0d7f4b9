"""The synthetic SFT corpus: exact formats of the three env families."""

from __future__ import annotations

import random

import pytest

from envs.tiny_policy.code_tasks import make_code_conversation
from envs.tiny_policy.corpus import (
    CALCULATOR_TOOL,
    RETRY_FEEDBACK,
    Family,
    make_corpus,
    make_math_conversation,
    make_tool_conversation,
    working,
)
from envs.tiny_policy.multi_turn import SEARCH_TOOL


def test_working_shows_one_intermediate_step_for_parenthesised_expressions():
    assert working("(12 + 7) * 3", 57) == "(12 + 7) * 3 = 19 * 3 = 57. \\boxed{57}"
    assert working("(3 - 15) * 2", -24) == "(3 - 15) * 2 = -12 * 2 = -24. \\boxed{-24}"


def test_working_of_a_flat_expression_is_the_answer_then_the_box():
    assert working("23 + 45", 68) == "23 + 45 = 68. \\boxed{68}"


def test_math_prompt_is_exactly_the_math_env_prompt_with_an_sft_split():
    conversation = make_math_conversation(random.Random(0), index=3, retry=False)
    question = conversation.messages[0]["content"]
    assert question.startswith("What is ") and question.endswith("? Put the final answer in \\boxed{}.")
    assert conversation.trained == (False, True)


def test_retry_conversation_trains_only_on_the_corrected_answer():
    conversation = make_math_conversation(random.Random(1), index=0, retry=True)
    roles = [message["role"] for message in conversation.messages]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert conversation.messages[2]["content"] == RETRY_FEEDBACK
    assert conversation.trained == (False, False, False, True)
    assert conversation.messages[1]["content"] != conversation.messages[3]["content"]


def test_tool_conversation_calls_the_calculator_and_boxes_its_result():
    conversation = make_tool_conversation(random.Random(2))
    question, call, result, answer = conversation.messages
    expression = call["tool_calls"][0]["function"]["arguments"]["expression"]
    assert expression in question["content"]
    assert result == {"role": "tool", "name": "calculator", "content": str(eval(expression))}
    assert answer["content"] == f"\\boxed{{{result['content']}}}"
    # The calculator alone, or with search as the tool preset offers both: each in some episodes.
    offered = [make_tool_conversation(random.Random(seed)).tools for seed in range(20)]
    assert set(map(len, offered)) == {1, 2}
    assert all(tools in ((CALCULATOR_TOOL,), (CALCULATOR_TOOL, SEARCH_TOOL)) for tools in offered)


def test_code_answer_is_a_fenced_python_block_defining_the_asked_function():
    question, answer = make_code_conversation(random.Random(3))
    name = question["content"].split("function ")[1].split("(")[0]
    assert answer["content"].startswith(f"```python\ndef {name}(")
    assert answer["content"].endswith("\n```")


def test_corpus_is_deterministic_in_its_seed_and_mixes_all_families():
    first, again, other = make_corpus(60, seed=7), make_corpus(60, seed=7), make_corpus(60, seed=8)
    assert first == again
    assert first != other
    assert {conversation.family for conversation in first} == set(Family)


def test_corpus_rejects_a_math_fraction_outside_zero_to_one():
    with pytest.raises(ValueError, match="math_fraction"):
        make_corpus(10, seed=0, math_fraction=1.5)
