"""Template pre-flight: replay conversations the way the agent loop tokenizes them, and check it.

For each conversation the check builds the token ids training would build, through the model
family's renderer (`agentrl.renderers`) with the same `prompt_ids` / `observation_delta` calls
as the agent loop: the prompt, then per assistant turn the sampled tokens (the text as the
tokenizer encodes it plus the stop token, loss mask 1) and the observation delta (loss mask 0).
It compares them, token by token, with a full re-render of the conversation so far.

Where the re-render does not extend what was sampled, the template rewrites history (Qwen3
and DeepSeek-R1 drop earlier reasoning, gpt-oss its analysis, a template that trims what the
model wrote): that is recorded as a `HistoryRewrite` naming the turn and the text dropped, and
the replay goes on from the full render, as `rollout.trajectory_mode=auto` trains it (a new
sample, a segment). Such templates train correctly; what cannot train is a `Violation`: a
template that renders the same messages differently twice (checked first, and reported alone,
since every other comparison would fail on it), no generation prompt, a sampled turn whose end
token is not one the engine stops on or that the template loses, tools the template never
renders, calls the family's parser does not read back, messages the template refuses.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

import jinja2

from agentrl.check_template.conversations import CALCULATOR, Conversation, Message
from agentrl.parsing.tool_calls import calls_of_message
from agentrl.renderers.base import Renderer
from agentrl.rollout.chat_template import ChatTemplate


@dataclass(frozen=True)
class Violation:
    """One broken property, located as precisely as the check can."""

    check: str  # determinism | generation_prompt | end_of_turn | tools | tool_call | render
    conversation: str
    turn: int | None  # 1-based assistant turn, None for whole-template properties
    token_index: int | None  # position in the episode's token ids (prompt included)
    message: str


class History(str, enum.Enum):
    """Whether a longer conversation's render extends a shorter one's."""

    APPENDS = "appends"  # every render extends the tokens sampled before it: one sample per episode
    REWRITES = "rewrites"  # some render changes earlier text: a new sample (segment) from there


@dataclass(frozen=True)
class HistoryRewrite:
    """Where a full re-render stops extending the tokens training built, and what it drops."""

    conversation: str
    turn: int  # 1-based assistant turn after which the re-render differs
    token_index: int  # first differing position in the episode's token ids
    dropped: str  # the built text the re-render does not have (or changes), around the difference
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
    family: str = "generic"  # the renderer's name
    episodes: list[CheckedEpisode] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    rewrites: list[HistoryRewrite] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def history(self) -> History:
        return History.REWRITES if self.rewrites else History.APPENDS

    @property
    def training_mode(self) -> str:
        """What `rollout.trajectory_mode=auto` makes of this template's episodes."""
        return "segments" if self.rewrites else "single"


def template_facts(
    template: ChatTemplate, stop_token_ids: Iterable[int]
) -> tuple[TemplateFacts, list[Violation]]:
    """The generation prompt and end-of-turn text, and violations of what the loop relies on."""
    opening = [{"role": "user", "content": "Hi."}]
    closed = template.render(opening, None, generation_prompt=False)
    opened = template.render(opening, None, generation_prompt=True)
    violations = []
    needs_header = getattr(template, "needs_generation_prompt", True)
    if not opened.startswith(closed) or (opened == closed and needs_header):
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
        try:
            first = template.render(messages, tools, generation_prompt)
        except (jinja2.TemplateError, TypeError):  # refused messages: the replay's violation, not this one's
            continue
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
    renderer: Renderer | ChatTemplate, stop_token_ids: Iterable[int], conversations: list[Conversation]
) -> TemplateReport:
    """Every check over every conversation; each conversation stops at its first violation.

    A template that renders the same messages differently twice gets only that violation. A
    bare `ChatTemplate` is checked as the generic renderer of its tokenizer.
    """
    if not isinstance(renderer, Renderer):
        renderer = Renderer(renderer.tokenizer)
    facts, violations = template_facts(renderer, stop_token_ids)
    determinism = determinism_violation(renderer, conversations)
    if determinism is not None:
        return TemplateReport(facts, renderer.name, violations=[determinism])
    report = TemplateReport(facts, renderer.name, violations=violations)
    for conversation in conversations:
        replay = _Replay(renderer, facts, conversation, report)
        try:
            replay.run()
        except (jinja2.TemplateError, TypeError) as error:  # the template refused the messages
            replay.fail("render", None, None, f"the template refused the messages: {error}")
        report.episodes.append(replay.episode)
    return report


class _Replay:
    """One conversation's tokens built turn by turn as the agent loop builds them."""

    def __init__(
        self, renderer: Renderer, facts: TemplateFacts, conversation: Conversation, report: TemplateReport
    ) -> None:
        self.renderer, self.facts, self.conversation, self.report = renderer, facts, conversation, report
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.episode = CheckedEpisode(conversation.name, [], [], 0)

    def fail(self, check: str, turn: int | None, index: int | None, message: str) -> None:
        self.report.violations.append(Violation(check, self.conversation.name, turn, index, message))

    def rewrite(self, turn: int, built: list[int], rendered: list[int], index: int, what: str) -> None:
        """Record that the re-render differs from the built tokens at `index`; go on from the render.

        A re-render that keeps the sampled text but not the token the turn stopped on is a
        violation instead: the model's decision to end its turn would appear in no later context.
        """
        decode = self.renderer.tokenizer.decode
        dropped = _dropped_text(
            decode(built[index:], skip_special_tokens=False),
            decode(rendered[index:], skip_special_tokens=False),
        )
        built_text, rendered_text = (decode(ids, skip_special_tokens=False) for ids in (built, rendered))
        stop_text = decode([self.facts.stop_token_id], skip_special_tokens=False)
        if built_text.endswith(stop_text) and not rendered_text.startswith(built_text):
            sampled_text = built_text[: len(built_text) - len(stop_text)]
            after = self.renderer.encode(rendered_text[len(sampled_text) :])[:1]
            # Replaced by another special token (harmony's <|return|> -> <|end|>) is a rewrite.
            replaced = bool(after) and after[0] in ChatTemplate.special_token_ids.func(self.renderer)
            if rendered_text.startswith(sampled_text) and not replaced:
                message = _describe(self.renderer, built, rendered, index, what, LOSES_END_TOKEN)
                return self.fail("end_of_turn", turn, index, message)
        message = _describe(self.renderer, built, rendered, index, what, REWRITES_HISTORY)
        self.report.rewrites.append(HistoryRewrite(self.conversation.name, turn, index, dropped, message))

    def run(self) -> None:
        renderer, tools, messages = self.renderer, self.conversation.tools, self.conversation.messages
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        history = messages[:first]
        self.ids = renderer.prompt_ids(history, tools)
        self.mask = [0] * len(self.ids)
        self.episode = CheckedEpisode(self.conversation.name, self.ids, self.mask, 0)
        if tools and renderer.render(history, tools, True) == renderer.render(history, None, True):
            return self.fail("tools", None, None, "the template renders the same text with and without tools")
        turn = 0
        for position, message in enumerate(messages[first:], start=first):
            if message["role"] != "assistant":
                continue
            turn += 1
            observation = _observation_after(messages, position)
            history = self._turn(turn, history, message, observation)
            if history is None:
                return None
        return None

    def _turn(
        self, turn: int, history: list[Message], message: Message, observation: list[Message]
    ) -> list[Message] | None:
        renderer, tools = self.renderer, self.conversation.tools
        text, problem, stop_id = _sampled_text(renderer, self.facts, history, message, tools)
        if problem:
            return self.fail("tool_call", turn, len(self.ids), problem)
        if stop_id is None:
            stop_id = self._stop_token(history, message, observation, text)
        completion_ids = renderer.encode(text) + [stop_id]
        reply_text = renderer.turn_text(completion_ids)  # what the env receives
        if message.get("tool_calls") and (problem := _tool_call_problem(renderer, reply_text, message)):
            return self.fail("tool_call", turn, len(self.ids), problem)
        history = history + [renderer.assistant_message(reply_text)]
        sampled = self.ids + completion_ids
        closed_ids = renderer.encode(renderer.render(history, tools, generation_prompt=False))
        # A template with no end-of-turn text starts the next turn with the stop token instead.
        comparable = sampled if self.facts.end_of_turn else sampled[:-1]
        index = _first_difference(comparable, closed_ids[: len(comparable)])
        if index == len(sampled) - 1 and self.facts.end_of_turn:
            return self.fail(
                "end_of_turn", turn, index,
                _describe(renderer, sampled, closed_ids, index, "sampled turn", LOSES_END_TOKEN),
            )  # fmt: skip
        self.ids, self.mask = sampled, self.mask + [1] * len(completion_ids)
        self.episode = CheckedEpisode(self.conversation.name, self.ids, self.mask, turn)
        if not observation:  # the episode ends: no later context has to extend it
            return history
        delta = renderer.observation_delta(history, completion_ids, observation, tools)
        history = history + observation
        full_ids = renderer.encode(renderer.render(history, tools, generation_prompt=True))
        built = self.ids + delta.token_ids
        index = _first_difference(built, full_ids)
        if index is None and delta.prefix_ok:
            self.ids, self.mask = built, self.mask + [0] * len(delta.token_ids)
        else:
            index = len(self.ids) if index is None else index
            self.rewrite(
                turn, self.ids, full_ids, min(index, len(self.ids)), f"observation after turn {turn}"
            )
            # A new sample starts from the full render, as trajectory_mode=auto trains it.
            self.ids, self.mask = full_ids, [0] * len(full_ids)
        self.episode = CheckedEpisode(self.conversation.name, self.ids, self.mask, turn)
        return history

    def _stop_token(
        self, history: list[Message], message: Message, observation: list[Message], text: str
    ) -> int:
        """The token the model stops on: the end-of-turn token, or (a template with none, GLM)
        the stop token its next turn starts with."""
        if self.facts.end_of_turn:
            return self.facts.stop_token_id
        renderer, tools = self.renderer, self.conversation.tools
        context = renderer.render(history, tools, generation_prompt=True) + text
        following = renderer.render(history + [message] + observation, tools, generation_prompt=True)
        after = renderer.encode(following[len(context) :]) if following.startswith(context) else []
        return after[0] if after and after[0] in renderer.stop_token_ids else self.facts.stop_token_id


def _sampled_text(
    renderer: Renderer, facts: TemplateFacts, history: list[Message], message: Message, tools
) -> tuple[str, str | None, int | None]:
    """What the model samples for `message` (its content, or for a message with tool calls or
    reasoning fields the template's rendering of it), and the stop token that rendering ends
    with when it is not the end of turn."""
    if set(message) <= {"role", "content"}:  # plain text: the model samples it as it is
        return message["content"], None, None
    opened = renderer.render(history, tools, generation_prompt=True)
    closed = renderer.render(history + [message], tools, generation_prompt=False)
    endings = [(facts.end_of_turn, None)] if facts.end_of_turn else []
    endings += [(renderer.tokenizer.decode([i]), i) for i in getattr(renderer, "stop_token_ids", ())]
    endings += [("", None)] if not facts.end_of_turn else []  # GLM: the next turn starts with the stop
    for ending, stop_id in endings:
        if closed.startswith(opened) and closed.endswith(ending):
            return closed[len(opened) : len(closed) - len(ending)], None, stop_id
    return (
        "",
        (
            f"the assistant turn renders as {closed[len(opened) - 40 :]!r}, which does not "
            f"start with the generation prompt {facts.generation_prompt!r} and end with "
            f"{facts.end_of_turn!r} or a stop token"
        ),
        None,
    )


def _tool_call_problem(renderer: Renderer, text: str, message: Message) -> str | None:
    expected = calls_of_message(message)
    parsed = renderer.parse(text)
    if parsed.malformed:
        reasons = " ".join(call.message for call in parsed.malformed)
        return f"the rendered tool call {text!r} is not one the tool_calling env would run: {reasons}"
    if parsed.well_formed != expected:
        return (
            f"the rendered tool call {text!r} parses as {parsed.well_formed} with the {renderer.name} "
            f"renderer's parser, expected {expected}; pick the family with model.renderer=NAME"
        )
    return None


def _dropped_text(built: str, rendered: str, anchor: int = 4) -> str:
    """The start of `built` that `rendered` leaves out: both begin at the first differing token;
    up to where `built` goes on as `rendered` begins (the next `anchor` characters agree)."""
    for end in range(1, len(built)):
        following = built[end : end + anchor]
        if len(following) == anchor and rendered.startswith(following):
            return built[:end]
    return built[:60]


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


REWRITES_HISTORY = "the template rewrites what was sampled once the conversation goes on"
LOSES_END_TOKEN = "the template does not render the end token the sampled turn stopped on"


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
