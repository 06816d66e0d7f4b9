"""The shipped checkpoint loads with the Auto classes and answers math in the boxed format."""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from envs.tiny_policy.tokenizer import MAX_LENGTH


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH), AutoTokenizer.from_pretrained(
        DEFAULT_MODEL_PATH
    )


def greedy(model, tokenizer, messages, tools=None, max_new_tokens=64) -> str:
    prompt = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    input_ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    output = model.generate(input_ids, do_sample=False, max_new_tokens=max_new_tokens)
    return tokenizer.decode(output[0, input_ids.shape[1] :])


def test_default_model_path_holds_a_complete_checkpoint():
    names = {path.name for path in DEFAULT_MODEL_PATH.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
    } <= names


def test_shipped_model_is_a_tiny_qwen2_with_tied_embeddings(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    assert model.config.model_type == "qwen2"
    assert model.config.tie_word_embeddings
    assert model.config.max_position_embeddings == MAX_LENGTH  # a three-hop search episode fits
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_shipped_model_answers_a_math_prompt_in_the_boxed_format(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    messages = [{"role": "user", "content": "What is 7 + 5? Put the final answer in \\boxed{}."}]
    # The format, not the sum: the policy is trained to be only partly right (RL's room to learn).
    reply = greedy(model, tokenizer, messages)
    assert re.fullmatch(r"7 \+ 5 = (-?\d+)\. \\boxed\{\1\}<\|im_end\|>", reply), reply


@pytest.mark.parametrize("with_search", [False, True], ids=["calculator", "calculator_and_search"])
def test_shipped_model_calls_the_calculator_when_given_the_tool(model_and_tokenizer, with_search):
    from envs.tiny_policy.corpus import CALCULATOR_TOOL
    from envs.tiny_policy.multi_turn import SEARCH_TOOL

    model, tokenizer = model_and_tokenizer
    messages = [{"role": "user", "content": "What is 12 + 17? Put the final answer in \\boxed{}."}]
    tools = (
        [CALCULATOR_TOOL, SEARCH_TOOL] if with_search else [CALCULATOR_TOOL]
    )  # the tool preset offers both
    completion = greedy(model, tokenizer, messages, tools=tools)
    body = completion.removeprefix("<tool_call>\n").removesuffix("\n</tool_call><|im_end|>")
    assert json.loads(body) == {"name": "calculator", "arguments": {"expression": "12 + 17"}}


def test_shipped_model_calls_a_terminal_tool_for_a_terminal_task(model_and_tokenizer):
    from envs.terminal.synthetic import tool_schemas
    from envs.terminal.task import prompt_text

    model, tokenizer = model_and_tokenizer
    task = "Create a file named notes.txt containing exactly the line: hello world"
    messages = [{"role": "user", "content": prompt_text(task)}]
    completion = greedy(model, tokenizer, messages, tools=list(tool_schemas()))
    body = completion.removeprefix("<tool_call>\n").removesuffix("\n</tool_call><|im_end|>")
    call = json.loads(body)  # the format, not the file name: the policy is only partly right here too
    assert call["name"] == "write_file" and set(call["arguments"]) == {"path", "content"}, completion


def test_shipped_model_writes_code_in_a_fenced_python_block(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    messages = [
        {"role": "user", "content": "Write a Python function add(a, b) that returns the sum of a and b."}
    ]
    completion = greedy(model, tokenizer, messages)
    assert completion == "```python\ndef add(a, b):\n    return a + b\n```<|im_end|>"
