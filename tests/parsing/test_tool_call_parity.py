"""One tool-call parse: the tool_calling env, the tool_call_format reward and check_template agree.

Each probe reply goes through each consumer's own public path: the env runs the calls it
parses and answers the rest with an error message; the reward scores the fraction of calls that
are well formed; check_template accepts a template whose rendered calls parse back exactly as
the calls it was asked to render. A template check that passed calls the env then rejects
would let a model be trained on a format the env never runs.
"""

import json
from dataclasses import dataclass
from typing import Any

import pytest
from transformers import AutoTokenizer

from agentrl.check_template import Conversation, check_template
from agentrl.rewards.builtin import tool_call_format
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.testing import play_sync
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from envs.tool_calling import ToolCallingEnv

ROW = {
    "data_source": "test",
    "prompt": [{"role": "user", "content": "Look it up. Put the final answer in \\boxed{}."}],
    "reward_model": {"ground_truth": "x"},
}
IM_END = 2  # the tiny tokenizer's <|im_end|>
# Renders an assistant message's content verbatim and ignores its `tool_calls`, so the text the
# check parses as "the template's rendering of the calls" is exactly the probe's reply.
VERBATIM = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


Call = tuple[str, dict[str, Any]]
INFINITY = float("inf")


def lookup(query: str) -> str:
    """Look a query up."""
    return f"found {query}"


def block(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


def call(query: str) -> str:
    return block("\n" + json.dumps({"name": "lookup", "arguments": {"query": query}}) + "\n")


@dataclass(frozen=True)
class Probe:
    reply: str
    intended: list[Call]  # the calls the reply was written to make
    runs: list[Call]  # the calls that parse as well formed, in order
    num_malformed: int


A, B = ("lookup", {"query": "a"}), ("lookup", {"query": "b"})
NESTED = '{"a": {"b": "}{"}, "c": "]"}'
PROBES = {
    "two calls": Probe(call("a") + "\n" + call("b"), [A, B], [A, B], 0),
    "a call with surrounding text": Probe(
        "Let me look that up.\n" + call("a") + "\nThen I answer.", [A], [A], 0
    ),
    "malformed json": Probe(block('{"name": "lookup", "arguments": {query: "a"}}'), [A], [], 1),
    "a call missing arguments": Probe(block('{"name": "lookup"}'), [("lookup", {})], [], 1),
    "arguments as a json string": Probe(
        block('{"name": "lookup", "arguments": "{\\"query\\": \\"a\\"}"}'), [A], [], 1
    ),
    "an extra key": Probe(
        block('{"name": "lookup", "arguments": {"query": "a"}, "id": "call_0"}'), [A], [], 1
    ),
    "infinity": Probe(
        block('{"name": "lookup", "arguments": {"query": Infinity}}'),
        [("lookup", {"query": INFINITY})],
        [],
        1,
    ),
    "nested braces in strings": Probe(
        call(NESTED), [("lookup", {"query": NESTED})], [("lookup", {"query": NESTED})], 0
    ),
    "whitespace and newlines around the json": Probe(
        block('\n\n  {"name": "lookup",\n  "arguments": {"query": "a"}}  \n\n'), [A], [A], 0
    ),
    "an unclosed call": Probe('<tool_call>\n{"name": "lookup", "arguments": {"query": "a"}}', [A], [], 1),
    "a good call then a malformed one": Probe(call("a") + block('{"name": "lookup"'), [A, B], [A], 1),
}
each_probe = pytest.mark.parametrize("probe", PROBES.values(), ids=PROBES.keys())


@pytest.fixture(scope="module")
def verbatim_template():
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    tokenizer.chat_template = VERBATIM
    return ChatTemplate(tokenizer)


@each_probe
def test_the_env_runs_the_well_formed_calls_and_answers_each_malformed_one_with_an_error(probe):
    [step] = play_sync(ToolCallingEnv(tools=[lookup]), [probe.reply], row=ROW).steps
    assert step.terminated is False
    runs = [
        (m["name"], {"query": m["content"].removeprefix("found ")}) for m in step.observation if "name" in m
    ]
    errors = [m["content"] for m in step.observation if "name" not in m]
    assert (runs, len(errors)) == (probe.runs, probe.num_malformed)
    assert all(error.startswith("Error: ") for error in errors)


@each_probe
def test_the_reward_scores_the_fraction_of_calls_the_env_runs(probe):
    num_calls = len(probe.runs) + probe.num_malformed
    assert tool_call_format([[{"role": "assistant", "content": probe.reply}]]) == [
        len(probe.runs) / num_calls
    ]


@each_probe
def test_check_template_accepts_a_rendering_exactly_when_the_env_runs_the_calls_it_renders(
    probe, verbatim_template
):
    tool_calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in probe.intended]
    messages = [
        {"role": "user", "content": "Look it up."},
        {"role": "assistant", "content": probe.reply, "tool_calls": tool_calls},
    ]
    report = check_template(verbatim_template, [IM_END], [Conversation("probe", messages)])
    env_runs_it = probe.runs == probe.intended and probe.num_malformed == 0
    assert [violation.check for violation in report.violations] == ([] if env_runs_it else ["tool_call"])
