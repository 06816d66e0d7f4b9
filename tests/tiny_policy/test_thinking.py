"""The thinking variant: worked steps in <think>, a template that drops earlier reasoning, its checkpoint."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.model_path import resolve_model_path
from agentrl.tiny_policy import THINK_MODEL_PATH
from envs.tiny_policy.chat_template import THINK_CHAT_TEMPLATE
from envs.tiny_policy.corpus import make_corpus, make_math_conversation
from envs.tiny_policy.examples import encode_conversation
from envs.tiny_policy.thinking import reasoning_steps, think_reply
from envs.tiny_policy.tokenizer import byte_tokenizer

FIRST = "<think>\n3 + 4 = 8.\n</think>\n\n\\boxed{8}"
SECOND = "<think>\n3 + 4 = 7.\n</think>\n\n\\boxed{7}"


def test_two_digit_operands_are_worked_by_tens_and_ones():
    assert reasoning_steps("83 - 47") == ["83 - 40 = 43.", "43 - 7 = 36."]
    assert reasoning_steps("12 * 11") == ["12 * 10 = 120.", "12 * 1 = 12.", "120 + 12 = 132."]
    assert reasoning_steps("(23 + 5) * 4") == ["23 + 5 = 28.", "28 * 4 = 112."]
    assert reasoning_steps("40 + 30") == ["40 + 30 = 70."]


def test_a_wrong_reply_reasons_to_its_wrong_answer():
    assert think_reply("83 - 47", 37) == "<think>\n83 - 40 = 43. 43 - 7 = 37.\n</think>\n\n\\boxed{37}"


def test_an_expression_outside_the_math_env_forms_is_refused():
    with pytest.raises(ValueError, match="no reasoning steps"):
        reasoning_steps("1 + 2 + 3")


def test_think_template_drops_reasoning_only_before_the_last_user_message():
    tokenizer = byte_tokenizer(THINK_CHAT_TEMPLATE)
    question = {"role": "user", "content": "What is 3 + 4?"}
    retry = {"role": "user", "content": "Try again."}
    messages = [
        question,
        {"role": "assistant", "content": FIRST},
        retry,
        {"role": "assistant", "content": SECOND},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert "3 + 4 = 8." not in text and "\\boxed{8}" in text  # the first reply keeps its answer only
    assert SECOND in text  # the last reply keeps its reasoning
    opening = tokenizer.apply_chat_template(messages[:2], tokenize=False)
    assert FIRST in opening  # before the retry, the first reply is the last one: kept whole
    assert not text.startswith(opening)  # so the template rewrites history


def test_a_retry_example_starts_at_the_full_render_of_its_trained_turn():
    tokenizer = byte_tokenizer(THINK_CHAT_TEMPLATE)
    conversation = make_math_conversation(random.Random(3), 0, retry=True, think=True)
    example = encode_conversation(tokenizer, conversation)
    context = tokenizer.apply_chat_template(
        list(conversation.messages[:-1]), tokenize=False, add_generation_prompt=True
    )
    trained = tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if m])
    assert tokenizer.decode(example.input_ids) == context + trained
    assert trained == conversation.messages[-1]["content"] + "<|im_end|>"


def test_think_corpus_replies_all_reason_first():
    corpus = make_corpus(50, seed=0, math_fraction=1.0, think=True)
    replies = [m["content"] for c in corpus for m in c.messages if m["role"] == "assistant"]
    assert replies and all(
        reply.startswith("<think>\n") and "</think>\n\n\\boxed{" in reply for reply in replies
    )


def test_tiny_think_resolves_to_the_shipped_thinking_checkpoint_with_its_template():
    assert resolve_model_path("tiny_think") == str(THINK_MODEL_PATH)
    tokenizer = AutoTokenizer.from_pretrained(THINK_MODEL_PATH)
    assert tokenizer.chat_template == THINK_CHAT_TEMPLATE


def test_shipped_thinking_policy_reasons_before_its_greedy_answer():
    tokenizer = AutoTokenizer.from_pretrained(THINK_MODEL_PATH)
    model = AutoModelForCausalLM.from_pretrained(THINK_MODEL_PATH)
    messages = [{"role": "user", "content": "What is 83 - 47? Put the final answer in \\boxed{}."}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    input_ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    output = model.generate(input_ids, do_sample=False, max_new_tokens=64)
    reply = tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True)
    assert reply.startswith("<think>\n") and "</think>\n\n\\boxed{" in reply
