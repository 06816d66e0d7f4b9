"""Template pre-flight: replay conversations the way the agent loop tokenizes them, and check it.

For each conversation the check builds the token ids training would build, with the same
`ChatTemplate.prompt_ids` / `observation_delta` calls as the agent loop: the prompt, then per
assistant turn the sampled tokens (the text as the tokenizer encodes it plus the stop token,
loss mask 1) and the observation delta (loss mask 0). It then compares them, token by token,
with a full re-render of the conversation so far. The first difference names the turn and the
token. It also checks the generation prompt, that an assistant turn ends on a token the engine
stops on, that the template renders tools, and that tool calls round-trip through the parser
the tool_calling env and the rewards use (`agentrl.parsing.tool_calls`).
First of all it renders every conversation twice: a template that reads the clock or draws a
random id renders differently each time, and every other check would blame that on something
else, so it is reported alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import jinja2

from agentrl.check_template.conversations import CALCULATOR, Conversation, Message
from agentrl.parsing.tool_calls import calls_of_message, parse_tool_calls
from agentrl.rollout.chat_template import ChatTemplate


@dataclass(frozen=True)
class Violation:
    """One broken property, located as precisely as the check can."""

    check: str  # determinism | generation_prompt | end_of_turn | tools | prefix | tool_call
    conversation: str
    turn: int | None  # 1-based assistant turn, None for whole-template properties
    token_index: int | None  # position in the episode's token ids (prompt included)
    message: str


@dataclass(frozen=True)
class TemplateFacts:
    """What the template puts around an assistant turn."""

    generation_prompt: str  # text add_generation_prompt=True appends
    end_of_turn: str  # text the template puts after an assistant message's content
    stop_token_id: int  # first token of end_of_turn: what the sampled turn ends with
    stop_token_ids: tuple[int, ...]  # ids the engine stops on (tokenizer and generation config EOS)


@dataclass(frozen=True)
class CheckedEpisode:
    """The tokens training would build for one conversation, up to the first violation."""

    conversation: str
    token_ids: list[int]  # [num_tokens] prompt and response
    loss_mask: list[int]  # [num_tokens] 1 exactly on sampled tokens
    num_turns: int  # assistant turns replayed


@dataclass
class TemplateReport:
    facts: TemplateFacts
    episodes: list[CheckedEpisode] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def template_facts(
    template: ChatTemplate, stop_token_ids: Iterable[int]
) -> tuple[TemplateFacts, list[Violation]]:
    """The generation prompt and end-of-turn text, and violations of what the loop relies on."""
    opening = [{"role": "user", "content": "Hi."}]
    closed = template.render(opening, None, generation_prompt=False)
    opened = template.render(opening, None, generation_prompt=True)
    violations = []
    if not opened.startswith(closed) or opened == closed:
        violations.append(
            Violation(
                "generation_prompt",
                "(probe)",
                None,
                None,
                f"add_generation_prompt=True must append an assistant header; rendered {closed!r} "
                f"without it and {opened!r} with it",
            )
        )
    end_of_turn = template.end_of_turn_text or ""
    end_ids = template.encode(end_of_turn)
    stop_ids = tuple(sorted(set(stop_token_ids)))
    stop_token_id = end_ids[0] if end_ids else stop_ids[0]
    if template.end_of_turn_text is None or stop_token_id not in stop_ids:
        violations.append(
            Violation(
                "end_of_turn",
                "(probe)",
                None,
                None,
                f"an assistant turn is followed by {end_of_turn!r}, whose first token "
                f"{_token(template, stop_token_id)} is not one the engine stops on "
                f"({', '.join(_token(template, i) for i in stop_ids)}): a sampled turn would not end "
                "where the template ends it; set eos_token / generation_config.eos_token_id to it",
            )
        )
    facts = TemplateFacts(opened[len(closed) :], end_of_turn, stop_token_id, stop_ids)
    return facts, violations


def renders_tools(template: ChatTemplate) -> bool:
    """Whether the template puts tool schemas into the prompt: then tool calls must survive it too."""
    opening = [{"role": "user", "content": "Hi."}]
    try:
        with_tools = template.render(opening, [CALCULATOR], generation_prompt=True)
    except jinja2.TemplateError:  # the template refuses tools (raise_exception): it has none to check
        return False
    return with_tools != template.render(opening, None, generation_prompt=True)


def determinism_violation(template: ChatTemplate, conversations: list[Conversation]) -> Violation | None:
    """Render each conversation (and the probe's prompt) twice; any difference is a violation."""
    renders = [("(probe)", [{"role": "user", "content": "Hi."}], None, True)]
    renders += [(c.name, c.messages, c.tools, False) for c in conversations]
    for name, messages, tools, generation_prompt in renders:
        first = template.render(messages, tools, generation_prompt)
        second = template.render(messages, tools, generation_prompt)
        if first != second:
            ours, theirs = _differing_text(first, second)
            return Violation(
                "determinism",
                name,
                None,
                None,
                f"rendering the same messages twice gave different text, {ours!r} the first time and "
                f"{theirs!r} the second: the template reads something that changes between renders, "
                "such as the clock or a random id, so no re-render reproduces the tokens the policy "
                "saw. Render it from a fixed value (a template variable) or leave it out; the other "
                "checks were not run, since every comparison of two renders would fail on it",
            )
    return None


def _differing_text(first: str, second: str) -> tuple[str, str]:
    """The lines where two renders differ, cut to 60 characters around the difference."""
    start = next(i for i, (a, b) in enumerate(zip(first + "\0", second + "\1")) if a != b)
    suffix = 0
    while suffix < min(len(first), len(second)) - start and first[-1 - suffix] == second[-1 - suffix]:
        suffix += 1

    def around(text: str) -> str:
        end = len(text) - suffix
        line_start = max(text.rfind("\n", 0, start) + 1, start - 60)
        line_end = text.find("\n", end)
        line_end = min(len(text) if line_end == -1 else line_end, end + 60)
        return text[line_start:line_end]

    return around(first), around(second)


def check_template(
    template: ChatTemplate, stop_token_ids: Iterable[int], conversations: list[Conversation]
) -> TemplateReport:
    """Every check over every conversation; each conversation stops at its first violation.

    A template that renders the same messages differently twice gets only that violation.
    """
    facts, violations = template_facts(template, stop_token_ids)
    determinism = determinism_violation(template, conversations)
    if determinism is not None:
        return TemplateReport(facts, violations=[determinism])
    report = TemplateReport(facts, violations=violations)
    for conversation in conversations:
        episode, violation = _replay(template, facts, conversation)
        report.episodes.append(episode)
        if violation is not None:
            report.violations.append(violation)
    return report


def _replay(
    template: ChatTemplate, facts: TemplateFacts, conversation: Conversation
) -> tuple[CheckedEpisode, Violation | None]:
    """Build the episode's tokens turn by turn as the agent loop does, checking after each step."""
    name, tools, messages = conversation.name, conversation.tools, conversation.messages
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    history = messages[:first]
    ids = template.prompt_ids(history, tools)
    mask = [0] * len(ids)
    episode = CheckedEpisode(name, ids, mask, 0)

    def fail(check: str, turn: int | None, index: int | None, message: str):
        return episode, Violation(check, name, turn, index, message)

    if tools and template.render(history, tools, True) == template.render(history, None, True):
        return fail("tools", None, None, "the template renders the same text with and without tools")
    turn = 0
    for position, message in enumerate(messages[first:], start=first):
        if message["role"] != "assistant":
            continue
        turn += 1
        text, problem = _sampled_text(template, facts, history, message, tools)
        if problem:
            return fail("prefix", turn, len(ids), problem)
        completion_ids = template.encode(text) + [facts.stop_token_id]
        # Exactly what the agent loop does with the sample: decode without special tokens.
        content = template.tokenizer.decode(completion_ids, skip_special_tokens=True)
        history = history + [{"role": "assistant", "content": content}]
        closed_ids = template.encode(template.render(history, tools, generation_prompt=False))
        sampled = ids + completion_ids
        index = _first_difference(sampled, closed_ids[: len(sampled)])
        if index is not None:
            return fail(
                "prefix",
                turn,
                index,
                _describe(template, sampled, closed_ids, index, "sampled turn", REWRITES_SAMPLE),
            )
        if message.get("tool_calls"):
            problem = _tool_call_problem(content, message)
            if problem:
                return fail("tool_call", turn, len(ids), problem)
        ids, mask = sampled, mask + [1] * len(completion_ids)
        episode = CheckedEpisode(name, ids, mask, turn)
        observation = _observation_after(messages, position)
        if not observation:
            continue
        delta = template.observation_delta(history, completion_ids, observation, tools)
        ids, mask = ids + delta.token_ids, mask + [0] * len(delta.token_ids)
        history = history + observation
        full_ids = template.encode(template.render(history, tools, generation_prompt=True))
        index = _first_difference(ids, full_ids)
        if index is not None or not delta.prefix_ok:
            index = len(ids) if index is None else index
            what = f"observation after turn {turn}"
            return fail(
                "prefix", turn, index, _describe(template, ids, full_ids, index, what, REWRITES_HISTORY)
            )
        episode = CheckedEpisode(name, ids, mask, turn)
    return episode, None


def _sampled_text(
    template: ChatTemplate, facts: TemplateFacts, history: list[Message], message: Message, tools
) -> tuple[str, str | None]:
    """What the model samples for `message`: its content, or for tool calls the template's rendering."""
    if not message.get("tool_calls"):
        return message["content"], None
    opened = template.render(history, tools, generation_prompt=True)
    closed = template.render(history + [message], tools, generation_prompt=False)
    if not closed.startswith(opened) or not closed.endswith(facts.end_of_turn):
        return "", (
            f"the assistant tool-call turn renders as {closed[len(opened) - 40 :]!r}, which does not "
            f"start with the generation prompt {facts.generation_prompt!r} and end with "
            f"{facts.end_of_turn!r}"
        )
    return closed[len(opened) : len(closed) - len(facts.end_of_turn)], None


def _tool_call_problem(content: str, message: Message) -> str | None:
    expected = calls_of_message(message)
    parsed = parse_tool_calls(content)
    if parsed.malformed:
        reasons = " ".join(call.message for call in parsed.malformed)
        return f"the rendered tool call {content!r} is not one the tool_calling env would run: {reasons}"
    if parsed.well_formed != expected:
        return f"the rendered tool call {content!r} parses as {parsed.well_formed}, expected {expected}"
    return None


def _observation_after(messages: list[Message], position: int) -> list[Message]:
    observation = []
    for message in messages[position + 1 :]:
        if message["role"] == "assistant":
            break
        observation.append(message)
    return observation


def _first_difference(built: list[int], rendered: list[int]) -> int | None:
    """First position where `built` and `rendered` disagree (a length difference counts)."""
    for index, (a, b) in enumerate(zip(built, rendered)):
        if a != b:
            return index
    return None if len(built) == len(rendered) else min(len(built), len(rendered))


def _token(template: ChatTemplate, token_id: int | None) -> str:
    if token_id is None:
        return "(nothing)"
    return f"{token_id} {template.tokenizer.decode([token_id], skip_special_tokens=False)!r}"


REWRITES_SAMPLE = "the template does not render the sampled text as it was sampled"
REWRITES_HISTORY = "the template rewrites earlier turns once the conversation goes on"


def _describe(
    template: ChatTemplate, built: list[int], rendered: list[int], index: int, what: str, why: str
) -> str:
    """Name the differing token and show the text before it."""
    context = template.tokenizer.decode(built[max(0, index - 12) : index], skip_special_tokens=False)
    ours = _token(template, built[index] if index < len(built) else None)
    theirs = _token(template, rendered[index] if index < len(rendered) else None)
    return (
        f"{what}: token {index} is {ours} in training but {theirs} in the full re-render "
        f"(after {context!r}): {why}, so training and a re-render disagree on what the policy saw"
    )
