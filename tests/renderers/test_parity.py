"""Each family's renderer against its published chat template (tests/renderers/templates/).

The incremental token stream (prompt ids + sampled ids + observation deltas, as the agent loop
builds it through the renderer) must equal a full `apply_chat_template` render of the
conversation wherever the family's template appends; where it rewrites history, the replay
must detect the rewrite at the turn where it happens and name what is dropped. The replay is
`agentrl.check_template.check_template`, the same code the pre-flight command runs.
Tokenizers: the tiny byte-level tokenizer with each family's special tokens (family_tokenizers).
"""

from __future__ import annotations

import pytest

from agentrl.check_template import Conversation, check_template
from agentrl.check_template.conversations import CALCULATOR, LOOKUP, chat_conversations
from agentrl.renderers import build_renderer
from tests.renderers.family_tokenizers import family_tokenizer

TOOLS = [CALCULATOR, LOOKUP]


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def tool(name, content):
    return {"role": "tool", "name": name, "content": content}


def user(content):
    return {"role": "user", "content": content}


def assistant(content, **fields):
    return {"role": "assistant", "content": content, **fields}


SINGLE_CALLS = Conversation(
    "single_calls",
    [
        {"role": "system", "content": "Use the tools."},
        user("What is 12 * 34, and who wrote Hamlet?"),
        assistant("", tool_calls=[call("calculator", expression="12 * 34")]),
        tool("calculator", "408"),
        assistant("", tool_calls=[call("lookup", query="Hamlet author", top_k=1)]),
        tool("lookup", "William Shakespeare."),
        assistant("408; Shakespeare."),
    ],
    TOOLS,
)
PARALLEL_CALLS = Conversation(
    "parallel_calls",
    [
        user("Who wrote Hamlet, and what is 2 ** 10?"),
        assistant(
            "", tool_calls=[call("lookup", query="Hamlet", top_k=1), call("calculator", expression="2 ** 10")]
        ),
        tool("lookup", "Shakespeare."),
        tool("calculator", "1024"),
        assistant("Shakespeare; 1024."),
    ],
    TOOLS,
)


def replay(family: str, conversations: list[Conversation], renderer: str = "auto"):
    tokenizer = family_tokenizer(family)
    rendered = build_renderer(tokenizer, renderer)
    return rendered, check_template(rendered, rendered.stop_token_ids, conversations)


def rewrites(report):
    return [(r.conversation, r.turn, r.dropped) for r in report.rewrites]


@pytest.mark.parametrize("family", ["qwen2.5", "llama3", "deepseek-r1", "glm4.5"])
def test_a_tool_episode_appends_and_equals_the_full_render(family):
    conversations = [SINGLE_CALLS] if family != "deepseek-r1" else []
    conversations += [c for c in chat_conversations() if c.name == "single_turn"]
    renderer, report = replay(family, conversations)
    assert report.violations == [] and report.rewrites == []
    assert report.training_mode == "single"
    if family != "deepseek-r1":
        episode = report.episodes[0]
        full = renderer.encode(renderer.render(SINGLE_CALLS.messages[:-1], TOOLS, generation_prompt=True))
        assert episode.token_ids[: len(full)] == full  # the stream equals apply_chat_template's render


def test_qwen25_appends_parallel_calls_and_every_chat_conversation():
    _, report = replay("qwen2.5", [PARALLEL_CALLS, *chat_conversations()])
    assert report.ok and report.rewrites == [] and report.family == "qwen2.5"


def test_qwen3_drops_earlier_reasoning_and_segments_train_it():
    _, report = replay("qwen3", [c for c in chat_conversations() if c.name == "reasoning"])
    assert report.ok
    assert rewrites(report) == [("reasoning", 1, "<think>\n3 plus 4 is 7.\n</think>\n\n")]
    assert report.training_mode == "segments"


def test_qwen3_with_thinking_off_closes_an_empty_think_block_in_the_prompt():
    renderer, report = replay(
        "qwen3", [c for c in chat_conversations() if c.name == "single_turn"], "qwen3_no_thinking"
    )
    assert renderer.template_kwargs == {"enable_thinking": False}
    prompt = renderer.render([user("Hi.")], None, generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert report.ok and report.rewrites == []


def test_qwen3_drops_the_empty_think_block_of_a_tool_call_turn():
    _, report = replay("qwen3", [SINGLE_CALLS])
    assert report.ok
    assert [(c, t) for c, t, _ in rewrites(report)] == [("single_calls", 1), ("single_calls", 2)]
    assert all("</think>" in dropped for _, _, dropped in rewrites(report))


def test_deepseek_r1_drops_the_reasoning_of_earlier_turns():
    conversation = Conversation(
        "r1",
        [
            user("What is 3 + 4?"),
            assistant("3 plus 4 is 7.\n</think>\n\n7"),
            user("And 5 * 6?"),
            assistant("30"),
        ],
    )
    _, report = replay("deepseek-r1", [conversation])
    assert report.ok and report.family == "deepseek"
    [(name, turn, dropped)] = rewrites(report)
    assert (name, turn) == ("r1", 1) and "3 plus 4 is 7." in dropped


def test_glm45_drops_the_reasoning_of_turns_before_the_latest_user_message():
    conversation = Conversation(
        "glm",
        [
            user("What is 3 + 4?"),
            assistant("7", reasoning_content="3 plus 4 is 7."),
            user("And 5 * 6?"),
            assistant("30", reasoning_content="5 times 6."),
        ],
    )
    _, report = replay("glm4.5", [conversation])
    assert report.ok
    assert rewrites(report) == [("glm", 1, "3 plus 4 is 7.")]


def test_gpt_oss_drops_the_analysis_of_earlier_turns():
    conversation = Conversation(
        "harmony",
        [
            user("What is 3 + 4?"),
            assistant("7", thinking="3 plus 4 is 7."),
            user("And 5 * 6?"),
            assistant("30", thinking="5 times 6."),
        ],
    )
    _, report = replay("gpt-oss", [conversation])
    assert report.ok and report.training_mode == "segments"
    [(name, turn, dropped)] = rewrites(report)
    assert (name, turn) == ("harmony", 1) and "analysis" in dropped


def test_templates_that_drop_tools_or_parallel_calls_cannot_train_them():
    _, llama = replay("llama3", [PARALLEL_CALLS])
    assert [v.check for v in llama.violations] == ["render"]
    assert "only supports single tool-calls" in llama.violations[0].message
    _, gpt_oss = replay("gpt-oss", [PARALLEL_CALLS])
    assert [v.check for v in gpt_oss.violations] == ["tool_call"]  # the template renders one call only
    _, r1 = replay("deepseek-r1", [SINGLE_CALLS])
    assert [v.check for v in r1.violations] == ["tools"]  # R1's template never renders the tools


def test_the_family_is_detected_from_each_published_template():
    detected = {
        family: build_renderer(family_tokenizer(family)).name
        for family in (
            "qwen2.5",
            "qwen3",
            "llama3",
            "mistral",
            "deepseek-r1",
            "deepseek-v3.1",
            "glm4.5",
            "gpt-oss",
        )
    }
    assert detected == {
        "qwen2.5": "qwen2.5", "qwen3": "qwen3", "llama3": "llama3", "mistral": "mistral",
        "deepseek-r1": "deepseek", "deepseek-v3.1": "deepseek", "glm4.5": "glm4.5", "gpt-oss": "gpt-oss",
    }  # fmt: skip


def test_mistral_moves_the_system_prompt_to_the_latest_user_message():
    _, report = replay("mistral", [c for c in chat_conversations() if c.name == "system_and_retry"])
    assert report.ok  # no generation prompt is right for this family: the answer follows [/INST]
    assert rewrites(report) == [("system_and_retry", 1, "You are a careful calculator.\n\n")]


def test_gpt_oss_renders_a_finished_final_message_with_end_instead_of_return_and_that_trains():
    conversation = Conversation(
        "harmony_plain", [user("Hi."), assistant("Hello."), user("Bye."), assistant("Bye.")]
    )
    # A field this template ignores: the sampled text is then the template's own rendering of the
    # turn, harmony headers included, as a gpt-oss model writes it.
    conversation.messages[1]["reasoning_content"] = None
    _, report = replay("gpt-oss", [conversation])
    assert report.ok
    [(name, turn, dropped)] = rewrites(report)
    assert (name, turn, dropped) == ("harmony_plain", 1, "<|return|>")
