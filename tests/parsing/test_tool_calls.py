"""The Hermes tool-call parser: content and every call of a reply, each well formed or explained."""

import pytest

from agentrl.parsing import (
    HermesToolCallParser,
    Malformation,
    MalformedCall,
    ParsedReply,
    ToolCall,
    calls_of_message,
)
from agentrl.renderers import reply_parser

parse_tool_calls = HermesToolCallParser().parse
SHAPE = 'a tool call must be a JSON object {"name": <tool name>, "arguments": <JSON object>}'
NOT_A_CALL = MalformedCall(Malformation.NOT_A_CALL, f"Error: {SHAPE}.")


def test_a_reply_without_calls_is_all_content():
    assert parse_tool_calls("  The answer is \\boxed{4}.\n") == ParsedReply("The answer is \\boxed{4}.", ())


def test_calls_are_returned_in_order_and_the_text_around_them_is_the_content():
    text = (
        "Let me compute both.\n"
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 1"}}\n</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": {"query": "Paris", "top_k": 2}}</tool_call>'
    )
    assert parse_tool_calls(text) == ParsedReply(
        "Let me compute both.",
        (ToolCall("calculator", {"expression": "1 + 1"}), ToolCall("search", {"query": "Paris", "top_k": 2})),
    )


def test_braces_and_tags_inside_json_strings_are_part_of_the_arguments():
    text = (
        '<tool_call>{"name": "echo", "arguments": {"text": "} {\\"a\\": [1, {}]} <tool_call>"}}</tool_call>'
    )
    assert parse_tool_calls(text).calls == (ToolCall("echo", {"text": '} {"a": [1, {}]} <tool_call>'}),)


def test_malformed_json_is_explained_and_the_good_call_next_to_it_is_kept():
    text = (
        '<tool_call>{"name": "calculator", "arguments": {expression}}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2"}}</tool_call>'
    )
    parsed = parse_tool_calls(text)
    assert parsed.malformed == [
        MalformedCall(
            Malformation.NOT_JSON,
            f"Error: the tool call is not valid JSON (Expecting property name enclosed in double quotes); "
            f"{SHAPE}.",
        )
    ]
    assert parsed.well_formed == [ToolCall("calculator", {"expression": "2"})]


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "now"}',  # no "arguments"
        '{"name": "calculator", "arguments": "{\\"expression\\": \\"1\\"}"}',  # arguments as a JSON string
        '{"name": "calculator", "arguments": {"expression": "1"}, "id": "call_0"}',  # an extra key
        '{"name": 3, "arguments": {}}',
        '["calculator", {"expression": "1"}]',
    ],
)
def test_anything_but_exactly_a_name_and_an_arguments_object_is_not_a_call(body):
    assert parse_tool_calls(f"<tool_call>{body}</tool_call>").calls == (NOT_A_CALL,)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_json_constants_outside_the_standard_are_rejected(constant):
    text = f'<tool_call>{{"name": "divide", "arguments": {{"numerator": {constant}}}}}</tool_call>'
    [call] = parse_tool_calls(text).calls
    assert call.reason is Malformation.NOT_JSON
    assert f"{constant.lstrip('-')} is not a JSON value" in call.message


def test_python_literals_are_never_evaluated():
    [call] = parse_tool_calls("<tool_call>{'name': __import__('os').getcwd()}</tool_call>").calls
    assert call.reason is Malformation.NOT_JSON


def test_an_unclosed_call_is_explained_and_left_out_of_the_content():
    text = 'Calling.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1"}}'
    assert parse_tool_calls(text) == ParsedReply(
        "Calling.",
        (MalformedCall(Malformation.UNCLOSED, "Error: a <tool_call> is not closed by </tool_call>."),),
    )


def test_the_hermes_format_is_the_generic_and_qwen_renderers_parser():
    assert isinstance(reply_parser("generic"), HermesToolCallParser)
    assert isinstance(reply_parser("qwen2.5"), HermesToolCallParser)
    with pytest.raises(ValueError, match="renderer='hermse' is not a renderer"):
        reply_parser("hermse")


def test_structured_calls_of_an_openai_message_accept_object_or_string_arguments():
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1"}}},
            {"type": "function", "function": {"name": "search", "arguments": '{"query": "Paris"}'}},
        ],
    }
    assert calls_of_message(message) == [
        ToolCall("calculator", {"expression": "1"}),
        ToolCall("search", {"query": "Paris"}),
    ]
