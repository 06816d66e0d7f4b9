"""Each family's parser on the formats its models write, malformed variants, and calls in reasoning."""

from __future__ import annotations

import pytest

from agentrl.parsing import Malformation, MalformedCall, ParsedReply, ToolCall
from agentrl.renderers import RENDERER_NAMES, reply_parser

CALC = ToolCall("calculator", {"expression": "1 + 1"})
LOOKUP = ToolCall("lookup", {"query": "Paris", "top_k": 2})


def parse(family: str, text: str) -> ParsedReply:
    return reply_parser(family).parse(text)


def reasons(reply: ParsedReply) -> list[Malformation]:
    return [call.reason for call in reply.calls if isinstance(call, MalformedCall)]


# -- Qwen3 / reasoning --


def test_qwen3_reasoning_is_split_off_and_calls_inside_it_do_not_count():
    text = (
        '<think>\nMaybe <tool_call>{"name": "rm", "arguments": {}}</tool_call>? No.\n</think>\n\n'
        'Computing.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 1"}}\n</tool_call>'
    )
    reply = parse("qwen3", text)
    assert reply == ParsedReply(
        "Computing.", (CALC,), 'Maybe <tool_call>{"name": "rm", "arguments": {}}</tool_call>? No.'
    )


def test_an_unclosed_think_block_is_all_reasoning_and_holds_no_calls():
    reply = parse(
        "qwen3", '<think>\nI will call <tool_call>{"name": "calculator", "arguments": {}}</tool_call>'
    )
    assert reply.calls == () and reply.content == "" and reply.reasoning.startswith("I will call")


def test_the_generic_renderer_does_not_split_reasoning():
    assert parse("generic", "<think>x</think>y").content == "<think>x</think>y"


# -- Llama 3 --


def test_llama3_parses_python_tag_and_plain_json_calls_and_semicolon_separated_ones():
    tagged = '<|python_tag|>{"name": "calculator", "parameters": {"expression": "1 + 1"}}'
    assert parse("llama3", tagged) == ParsedReply("", (CALC,))
    plain = '{"name": "calculator", "parameters": {"expression": "1 + 1"}}'
    assert parse("llama3", plain) == ParsedReply("", (CALC,))
    both = plain + '; {"name": "lookup", "arguments": {"query": "Paris", "top_k": 2}}'
    assert parse("llama3", both).calls == (CALC, LOOKUP)


def test_llama3_prose_and_json_data_that_is_not_a_call_are_content():
    assert parse("llama3", "The answer is 2.") == ParsedReply("The answer is 2.", ())
    assert parse("llama3", '{"answer": 2}').calls == ()


def test_llama3_bad_json_and_wrong_shapes_are_malformed():
    assert reasons(parse("llama3", '{"name": "calculator", "parameters": {"expression": "1 + 1"}')) == [
        Malformation.NOT_JSON
    ]
    assert reasons(parse("llama3", '<|python_tag|>{"name": "calculator", "parameters": [1]}')) == [
        Malformation.NOT_A_CALL
    ]


# -- Mistral --


def test_mistral_parses_the_v3_array_and_the_v11_named_forms():
    v3 = 'Let me see.[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "1 + 1"}, "id": "abc123def"}, {"name": "lookup", "arguments": {"query": "Paris", "top_k": 2}}]'
    assert parse("mistral", v3) == ParsedReply("Let me see.", (CALC, LOOKUP))
    v11 = '[TOOL_CALLS]calculator[ARGS]{"expression": "1 + 1"}[TOOL_CALLS]lookup[CALL_ID]a1b2c3d4e[ARGS]{"query": "Paris", "top_k": 2}'
    assert parse("mistral", v11).calls == (CALC, LOOKUP)


def test_mistral_malformed_calls_say_why():
    assert reasons(parse("mistral", '[TOOL_CALLS][{"name": "calculator", "arguments": {')) == [
        Malformation.NOT_JSON
    ]
    assert reasons(parse("mistral", "[TOOL_CALLS]calculator {}")) == [Malformation.NO_HEADER]


# -- DeepSeek --


def test_deepseek_parses_the_v3_fenced_and_the_v31_forms_after_r1_reasoning():
    v3 = (
        "I should compute.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n"
        '```json\n{"expression": "1 + 1"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>lookup\n'
        '```json\n{"query": "Paris", "top_k": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    )
    assert parse("deepseek", v3) == ParsedReply("", (CALC, LOOKUP), "I should compute.")
    v31 = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calculator<｜tool▁sep｜>{"expression": "1 + 1"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    assert parse("deepseek", v31).calls == (CALC,)


def test_deepseek_unclosed_sections_and_calls_inside_reasoning():
    unclosed = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calculator<｜tool▁sep｜>{"expression": "1'
    assert reasons(parse("deepseek", unclosed)) == [Malformation.UNCLOSED]
    inside = "<think>call <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>x<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜></think>done"
    assert parse("deepseek", inside).calls == () and parse("deepseek", inside).content == "done"


# -- GLM-4.5 --


def test_glm_parses_arg_key_value_pairs_with_json_values():
    text = (
        "<think>Two calls.</think>\n<tool_call>calculator\n<arg_key>expression</arg_key>\n<arg_value>1 + 1</arg_value>\n"
        "</tool_call>\n<tool_call>lookup\n<arg_key>query</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>top_k</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"
    )
    assert parse("glm4.5", text) == ParsedReply("", (CALC, LOOKUP), "Two calls.")


def test_glm_malformed_blocks():
    assert reasons(parse("glm4.5", "<tool_call>calculator\n<arg_key>expression</arg_key>")) == [
        Malformation.UNCLOSED
    ]
    assert reasons(
        parse("glm4.5", "<tool_call>\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>")
    ) == [Malformation.NOT_A_CALL]


# -- gpt-oss (harmony) --


def test_harmony_channels_become_reasoning_content_and_calls():
    call = '<|channel|>analysis<|message|>Need the calculator.<|end|><|start|>assistant to=functions.calculator<|channel|>commentary <|constrain|>json<|message|>{"expression": "1 + 1"}'
    assert parse("gpt-oss", call) == ParsedReply("", (CALC,), "Need the calculator.")
    recipient_after_channel = '<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{"query": "Paris", "top_k": 2}<|call|>'
    assert parse("gpt-oss", recipient_after_channel).calls == (LOOKUP,)
    final = "<|channel|>analysis<|message|>to=functions.calculator is not needed<|end|><|start|>assistant<|channel|>final<|message|>2"
    assert parse("gpt-oss", final) == ParsedReply("2", (), "to=functions.calculator is not needed")


def test_harmony_bad_json_and_a_call_ended_as_a_message_are_malformed():
    assert reasons(parse("gpt-oss", "<|channel|>commentary to=functions.calculator<|message|>{oops")) == [
        Malformation.NOT_JSON
    ]
    ended = '<|channel|>commentary to=functions.calculator<|message|>{"expression": "1"}<|end|>'
    assert reasons(parse("gpt-oss", ended)) == [Malformation.UNCLOSED]


# -- every family --


@pytest.mark.parametrize("family", RENDERER_NAMES)
def test_an_unknown_tool_parses_as_a_call_the_env_then_rejects_by_name(family):
    texts = {
        "llama3": '{"name": "nope", "parameters": {}}',
        "mistral": '[TOOL_CALLS][{"name": "nope", "arguments": {}}]',
        "deepseek": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>nope<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "glm4.5": "<tool_call>nope\n</tool_call>",
        "gpt-oss": "<|channel|>commentary to=functions.nope<|message|>{}",
    }
    text = texts.get(
        family.removesuffix("_thinking"), '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
    )
    assert parse(family, text).calls == (ToolCall("nope", {}),)


def test_an_unknown_family_names_the_closest_and_every_valid_one():
    with pytest.raises(
        ValueError, match=r"renderer='qwen' is not a renderer. Did you mean 'qwen3'\? Valid: auto, generic"
    ):
        reply_parser("qwen")
