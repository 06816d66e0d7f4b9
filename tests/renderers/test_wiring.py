"""The run's renderer reaches every parse site: the env, the rewards, and the config key."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentrl.engine.config import ModelConfig
from agentrl.renderers import build_renderer, reply_parser, run_parser, use_run_parser
from agentrl.rewards.builtin import tool_call_format
from envs.tool_calling import ToolCallingEnv
from tests.renderers.family_tokenizers import family_tokenizer

LLAMA_CALL = '{"name": "calculator", "parameters": {"expression": "6 * 7"}}'
ROW = {
    "data_source": "test",
    "prompt": [{"role": "user", "content": "What is 6 * 7? Put the answer in \\boxed{}."}],
    "reward_model": {"ground_truth": "42"},
}


def test_the_tool_env_runs_calls_in_the_format_of_the_parser_it_is_handed():
    env = ToolCallingEnv(tools=["calculator"])
    env.reset(options=ROW)
    observation, *_ = env.step(LLAMA_CALL)
    assert observation == []  # Hermes by default: a Llama call is no call, so it was the answer
    env.use_reply_parser(reply_parser("llama3"))
    env.reset(options=ROW)
    observation, _, terminated, _, _ = env.step(LLAMA_CALL)
    assert observation == [{"role": "tool", "content": "42", "name": "calculator"}] and not terminated
    env.close()


def test_tool_call_format_scores_calls_in_the_runs_format(monkeypatch):
    completion = [{"role": "assistant", "content": "<think><tool_call>bad</tool_call></think>" + LLAMA_CALL}]
    monkeypatch.setattr("agentrl.renderers.active._run_parser", run_parser())  # restored after the test
    use_run_parser(reply_parser("llama3"))
    assert tool_call_format([completion]) == [None]  # Llama 3 has no <think>: the tag text is content
    use_run_parser(reply_parser("qwen3"))
    assert tool_call_format([completion]) == [None]  # the only Hermes block is inside the reasoning
    use_run_parser(reply_parser("generic"))
    assert tool_call_format([completion]) == [0.0]


def test_model_renderer_is_validated_at_config_time_and_overrides_detection():
    assert ModelConfig().renderer == "auto"
    with pytest.raises(
        ValidationError, match="model.renderer='llama' is not a renderer. Did you mean 'llama3'"
    ):
        ModelConfig(renderer="llama")
    tokenizer = family_tokenizer("qwen3")
    assert build_renderer(tokenizer).name == "qwen3"
    assert build_renderer(tokenizer, "qwen3_no_thinking").template_kwargs == {"enable_thinking": False}


def test_a_family_with_markup_tokens_keeps_them_in_the_turn_text_and_stops_only_on_its_stop_tokens():
    renderer = build_renderer(family_tokenizer("mistral"))
    ids = renderer.encode('[TOOL_CALLS][{"name": "calculator", "arguments": {}}]</s>')
    assert renderer.turn_length(ids) == len(ids)  # [TOOL_CALLS] is part of the turn; </s> ends it
    assert renderer.turn_text(ids) == '[TOOL_CALLS][{"name": "calculator", "arguments": {}}]'
    assert renderer.tokenizer.convert_ids_to_tokens(list(renderer.stop_token_ids)) == ["</s>"]
