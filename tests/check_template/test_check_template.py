"""The template pre-flight passes the tiny policy's template, names the turn, token and text of
history rewrites (which train as segments) and fails only templates that cannot train."""

from __future__ import annotations

import re

from transformers import AutoTokenizer

from agentrl.check_template import History, check_template, conversations, renders_tools
from agentrl.check_template.__main__ import main
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.tiny_policy import DEFAULT_MODEL_PATH

IM_END = 2  # the tiny tokenizer's <|im_end|>, its EOS

# ChatML like the tiny policy's, with one breakage each. `{content}` is the expression that
# renders an assistant message's content; tool calls render from `tool_calls` as Hermes blocks.
CHATML = (
    "{%- if tools %}{{- '<|im_start|>system\\ntools: ' + (tools | tojson) + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + CONTENT }}"
    "{%- for call in message.tool_calls or [] %}{%- set call = call.function %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' + (call.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
KEEPS_EVERYTHING = CHATML.replace("CONTENT", "message.content")
# Like Qwen3's template: reasoning of assistant turns before the last message is dropped.
STRIPS_EARLIER_REASONING = CHATML.replace(
    "CONTENT",
    "(message.content if loop.last else message.content.split('</think>')[-1].lstrip('\\n'))",
)
TRIMS_WHITESPACE = CHATML.replace("CONTENT", "(message.content | trim)")
DROPS_EARLIER_TOOL_CALLS = CHATML.replace(
    "CONTENT", "(message.content if loop.last else message.content.split('<tool_call>')[0])"
)
# Closes only the last assistant turn with <|im_end|>: an earlier turn loses the token it stopped on.
LOSES_EARLIER_END_TOKEN = CHATML.replace("CONTENT", "message.content").replace(
    "{{- '<|im_end|>\\n' }}{%- elif message.role == 'tool' %}",
    "{{- '<|im_end|>\\n' if loop.last else '\\n' }}{%- elif message.role == 'tool' %}",
)
RENDERS_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\ntools: ' + (tools | tojson) + '<|im_end|>\\n' }}{%- endif %}"
)
# A system line with the time of day to the microsecond, like templates that print today's date:
# two renders a few microseconds apart differ.
CLOCK_IN_SYSTEM_LINE = KEEPS_EVERYTHING.replace(
    RENDERS_TOOLS, "{{- '<|im_start|>system\\nTime: ' + strftime_now('%H:%M:%S.%f') + '<|im_end|>\\n' }}"
)


def template_with(source: str) -> ChatTemplate:
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    tokenizer.chat_template = source
    return ChatTemplate(tokenizer)


def prompt_length(template: ChatTemplate, conversation_name: str, with_tools: bool = False) -> int:
    """Tokens before the first sampled token of `conversation_name`."""
    conversation = next(c for c in conversations(with_tools) if c.name == conversation_name)
    first = next(i for i, m in enumerate(conversation.messages) if m["role"] == "assistant")
    return len(template.prompt_ids(conversation.messages[:first], conversation.tools))


def test_the_tiny_policys_template_passes_every_check_with_tools():
    template = ChatTemplate(AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH))
    report = check_template(template, [IM_END], conversations(with_tools=True))
    assert report.violations == []
    assert report.facts.generation_prompt == "<|im_start|>assistant\n"
    assert report.facts.end_of_turn == "<|im_end|>\n"
    assert [(e.conversation, e.num_turns) for e in report.episodes] == [
        ("single_turn", 1),
        ("system_and_retry", 2),
        ("reasoning", 2),
        ("whitespace", 2),
        ("tool_call", 2),
        ("parallel_tool_calls", 3),
    ]


def test_loss_mask_is_one_exactly_on_the_sampled_text_and_its_end_of_turn_token():
    template = ChatTemplate(AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH))
    report = check_template(template, [IM_END], conversations(with_tools=False))
    episode = next(e for e in report.episodes if e.conversation == "system_and_retry")
    sampled = [t for t, m in zip(episode.token_ids, episode.loss_mask, strict=True) if m == 1]
    assert (
        template.tokenizer.decode(sampled) == "47 - 18 = \\boxed{31}<|im_end|>47 - 18 = \\boxed{29}<|im_end|>"
    )


def test_a_template_that_strips_earlier_reasoning_rewrites_history_at_turn_1_and_trains_as_segments():
    template = template_with(STRIPS_EARLIER_REASONING)
    report = check_template(template, [IM_END], conversations(with_tools=False))
    assert report.ok and report.history is History.REWRITES and report.training_mode == "segments"
    [rewrite] = report.rewrites
    assert (rewrite.conversation, rewrite.turn) == ("reasoning", 1)
    assert rewrite.token_index == prompt_length(template, "reasoning")
    assert rewrite.dropped == "<think>\n3 plus 4 is 7.\n</think>\n\n"
    assert "observation after turn 1: token" in rewrite.message
    # Token ids as the tokenizer splits: '<' opens the dropped reasoning, the re-render goes on with "The".
    found = re.search(r"is (\d+) '<' in training but (\d+) '(\w+)' in the full re-render", rewrite.message)
    assert found, rewrite.message
    less_than, rendered_id, rendered_text = int(found[1]), int(found[2]), found[3]
    assert (
        template.tokenizer.decode([less_than]) == "<"
        and template.tokenizer.decode([rendered_id]) == rendered_text
    )
    assert "The".startswith(rendered_text)


def test_a_template_that_trims_whitespace_rewrites_the_leading_space_the_model_sampled():
    template = template_with(TRIMS_WHITESPACE)
    report = check_template(template, [IM_END], conversations(with_tools=False))
    assert report.ok
    [rewrite] = report.rewrites
    assert (rewrite.conversation, rewrite.turn, rewrite.dropped) == ("whitespace", 1, " ")
    assert rewrite.token_index == prompt_length(template, "whitespace")
    space_backslash, boxed = template.tokenizer.convert_tokens_to_ids(["Ġ\\", "\\boxed"])
    assert (
        rf"is {space_backslash} ' \\' in training but {boxed} '\\boxed' in the full re-render"
        in rewrite.message
    )


def test_a_template_that_drops_earlier_tool_calls_rewrites_history_at_the_tool_call_of_turn_1():
    template = template_with(DROPS_EARLIER_TOOL_CALLS)
    report = check_template(template, [IM_END], conversations(with_tools=True))
    assert report.ok
    assert [(r.conversation, r.turn, r.token_index) for r in report.rewrites][:2] == [
        ("tool_call", 1, prompt_length(template, "tool_call", with_tools=True)),
        ("parallel_tool_calls", 1, prompt_length(template, "parallel_tool_calls", with_tools=True)),
    ]
    assert report.rewrites[0].dropped.startswith("<tool_call>")
    assert "'<tool_call>' in training but" in report.rewrites[0].message


def test_a_template_that_loses_the_end_token_of_an_earlier_turn_cannot_train():
    report = check_template(template_with(LOSES_EARLIER_END_TOKEN), [IM_END], conversations(with_tools=False))
    assert [(v.check, v.conversation, v.turn) for v in report.violations] == [
        ("end_of_turn", "system_and_retry", 1), ("end_of_turn", "reasoning", 1), ("end_of_turn", "whitespace", 1),
    ]  # fmt: skip
    assert "does not render the end token the sampled turn stopped on" in report.violations[0].message


def test_the_same_chatml_without_a_breakage_passes():
    report = check_template(template_with(KEEPS_EVERYTHING), [IM_END], conversations(with_tools=True))
    assert report.violations == []


def test_a_turn_end_the_engine_does_not_stop_on_is_a_violation():
    closes_assistant = "{{- '<|im_end|>\\n' }}{%- elif message.role == 'tool' %}"
    assert closes_assistant in KEEPS_EVERYTHING
    source = KEEPS_EVERYTHING.replace(
        closes_assistant, "{{- '<|endoftext|>' }}{%- elif message.role == 'tool' %}"
    )
    report = check_template(template_with(source), [IM_END], conversations(with_tools=False))
    assert report.violations[0].check == "end_of_turn"
    assert "'<|endoftext|>'" in report.violations[0].message


def test_a_template_without_a_generation_prompt_is_a_violation():
    source = KEEPS_EVERYTHING.replace(
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}", ""
    )
    report = check_template(template_with(source), [IM_END], conversations(with_tools=False))
    assert report.violations[0].check == "generation_prompt"


def test_the_command_says_how_each_template_trains_and_exits_1_only_when_it_cannot(tmp_path, capsys):
    assert main([str(DEFAULT_MODEL_PATH), "--tools"]) == 0
    output = capsys.readouterr().out
    assert output.startswith("family: generic (model.renderer=auto detects generic;")
    assert "history: appends" in output and "trains each episode as one sample (single)" in output
    assert output.endswith("ok: the template keeps every token training relies on\n")
    for name, source in (("strips", STRIPS_EARLIER_REASONING), ("loses", LOSES_EARLIER_END_TOKEN)):
        tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
        tokenizer.chat_template = source
        tokenizer.save_pretrained(tmp_path / name)
    assert main([str(tmp_path / "strips")]) == 0
    output = capsys.readouterr().out
    assert "reasoning after turn 1, token" in output and "drops or changes '<think>" in output
    assert "trains these episodes as segments" in output
    assert main([str(tmp_path / "loses")]) == 1
    output = capsys.readouterr().out
    assert "VIOLATION [end_of_turn] system_and_retry turn 1 token" in output
    assert output.endswith("FAILED\n")


def test_the_command_rejects_an_unknown_renderer_naming_the_valid_ones(capsys):
    assert main([str(DEFAULT_MODEL_PATH), "--renderer", "qwen"]) == 2
    assert "'qwen' is not a renderer. Did you mean 'qwen3'?" in capsys.readouterr().err


def test_a_template_that_reads_the_clock_fails_the_determinism_check_alone_and_shows_the_differing_text():
    assert CLOCK_IN_SYSTEM_LINE != KEEPS_EVERYTHING
    report = check_template(template_with(CLOCK_IN_SYSTEM_LINE), [IM_END], conversations(with_tools=False))
    [violation] = report.violations
    assert (violation.check, violation.conversation, violation.turn) == ("determinism", "(probe)", None)
    assert "rendering the same messages twice gave different text, 'Time: " in violation.message
    assert "such as the clock or a random id" in violation.message
    assert report.episodes == []


def test_the_command_reports_a_clock_in_the_template_as_such(tmp_path, capsys):
    saved = tmp_path / "clock"
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    tokenizer.chat_template = CLOCK_IN_SYSTEM_LINE
    tokenizer.save_pretrained(saved)
    assert main([str(saved)]) == 1
    output = capsys.readouterr().out
    [violation] = [line for line in output.splitlines() if line.startswith("VIOLATION")]
    assert violation.startswith("VIOLATION [determinism] (probe): rendering the same messages twice")
    assert "generation_prompt" not in output
    assert output.endswith("FAILED\n")


def test_tool_calls_are_checked_without_the_flag_when_the_template_renders_tools(tmp_path, capsys):
    saved = tmp_path / "drops_tool_calls"
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    tokenizer.chat_template = DROPS_EARLIER_TOOL_CALLS
    tokenizer.save_pretrained(saved)
    assert main([str(saved)]) == 0
    output = capsys.readouterr().out
    assert "tool_call after turn 1, token" in output
    assert "parallel_tool_calls after turn 1, token" in output


def test_a_template_without_tools_is_checked_on_chat_conversations_only():
    without_tools = KEEPS_EVERYTHING.replace(RENDERS_TOOLS, "")
    assert without_tools != KEEPS_EVERYTHING
    assert not renders_tools(template_with(without_tools))
    assert renders_tools(template_with(KEEPS_EVERYTHING))
