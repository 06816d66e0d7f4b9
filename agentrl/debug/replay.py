"""Debugger: check a recorded trajectory against a full render of its conversation.

The agent loop builds the trained tokens piece by piece (the sampled tokens, then the template's
delta after each observation). Training is sound only if they equal what the chat template renders
for the same messages, so replay checks that without the loop's delta logic: for each turn k it
renders the conversation up to and including that turn (the env's opening messages for the row,
then every recorded action text and observation) with `apply_chat_template`, and compares the
trained tokens up to the end of turn k's sampled tokens with that render.

An episode trained as several samples (its history was rewritten) is checked sample by sample
(`sample_views`): each sample against the renders of its own turns, from the conversation its
prompt renders.

Sampled tokens that spell the render's text with another split are the policy's own tokenization
(the loop never re-tokenizes what the model produced); they are noted, not counted as a mismatch.
Any other difference is a token training used that a fresh render does not produce: a wrong delta,
a template that rewrites history, a special token the turn's text cannot carry, a changed
tokenizer, a corrupted dump.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.rollout.chat_template import ChatTemplate, Message
from agentrl.rollout.trajectory import Trajectory, Turn

RESPLIT_WINDOW = 8  # longest token span, on either side, tried when looking for the same text


@dataclass(frozen=True)
class Mismatch:
    """The first position where the trained tokens and a full render of the conversation disagree."""

    render: str  # the render that disagrees, e.g. "the context of turn 2"
    turn: int  # where the position lies: 0 the prompt, k turn k's sampled tokens or its observation
    part: str  # "prompt", "sampled" or "observation"
    position: int  # index in prompt + response
    trained_id: int | None  # None: the trained tokens end here
    rendered_id: int | None  # None: the render ends here


@dataclass(frozen=True)
class Resplit:
    """Sampled tokens that spell the same text as the render's tokens, split differently."""

    turn: int
    position: int  # index in prompt + response of the first differing token
    num_trained_tokens: int
    num_rendered_tokens: int


@dataclass
class RenderCheck:
    """What full renders of the conversation say about the trained tokens."""

    mismatch: Mismatch | None
    num_trained_tokens: int  # compared: all but the unrecorded ones
    num_rendered_tokens: int  # a full render of the whole conversation
    resplits: list[Resplit] = field(default_factory=list)
    num_unrecorded_tokens: int = 0  # sampled tokens after the last turn the env never answered


@dataclass(frozen=True)
class _Span:
    turn: int
    part: str  # "prompt", "sampled" or "observation"
    start: int
    end: int


@dataclass(frozen=True)
class _Render:
    """One full render, and the trained tokens [0, end) it must reproduce."""

    name: str
    messages: list[Message]
    generation_prompt: bool
    end: int
    whole: bool  # the trained tokens are all of the render (else a prefix: the turn's closing follows)


def sample_views(opening: list[Message], trajectory: Trajectory) -> list[tuple[list[Message], Trajectory]]:
    """Each sample of the episode as a one-sample trajectory of its turns, with the messages its
    prompt renders (a turn with `starts_new_sample` is the last of its sample)."""
    groups: list[list[Turn]] = [[]]
    for turn in trajectory.turns:
        groups[-1].append(turn)
        if turn.starts_new_sample:
            groups.append([])
    views, messages = [], list(opening)
    for sample, turns in zip(trajectory.samples(), groups, strict=False):
        view = Trajectory(
            group_id=trajectory.group_id,
            prompt_ids=sample.prompt_ids,
            response_ids=sample.response_ids,
            loss_mask=sample.loss_mask,
            rollout_logprobs=sample.rollout_logprobs,
            turns=turns,
        )
        views.append((messages, view))
        for turn in turns:
            history = turn.rewritten_history
            if history is None:
                history = [*messages, {"role": "assistant", "content": turn.action_text}]
            messages = [*history, *turn.observation]
    return views


def check_render(
    template: ChatTemplate, opening: list[Message], tools: list[dict] | None, trajectory: Trajectory
) -> RenderCheck:
    """Compare `trajectory`'s tokens with full renders of its messages, turn by turn.

    Raises ValueError when the turns hold more tokens than the trajectory (a corrupted dump).
    """
    if trajectory.earlier_segments:
        raise ValueError(
            f"the trajectory has {len(trajectory.samples())} samples: check each of sample_views(opening, trajectory)"
        )
    trained = trajectory.prompt_ids + trajectory.response_ids
    sampled = [0] * len(trajectory.prompt_ids) + trajectory.loss_mask
    spans, renders = _plan(opening, trajectory)
    covered = spans[-1].end
    if covered > len(trained):
        raise ValueError(f"the trajectory's turns hold {covered} tokens but it has only {len(trained)}")

    def encode(render: _Render) -> list[int]:
        return template.encode(template.render(render.messages, tools, render.generation_prompt))

    check = RenderCheck(None, covered, len(encode(renders[-1])), num_unrecorded_tokens=len(trained) - covered)
    checked = 0  # trained tokens an earlier render reproduced
    for render in renders:
        rendered = encode(render)
        found, resplits = _compare(template, trained[: render.end], sampled, rendered, render.whole)
        check.resplits += [_resplit(spans, *resplit) for resplit in resplits if resplit[0] >= checked]
        if found is not None:
            index, rendered_index = found
            span = next((s for s in spans if s.start <= index < s.end), spans[-1])
            check.mismatch = Mismatch(
                render.name, span.turn, span.part, index,
                trained[index] if index < len(trained) else None,
                rendered[rendered_index] if rendered_index < len(rendered) else None,
            )  # fmt: skip
            break
        checked = render.end
    return check


def _plan(opening: list[Message], trajectory: Trajectory) -> tuple[list[_Span], list[_Render]]:
    """Where the prompt, each turn's sampled tokens and each observation lie, and the renders to check.

    The last turn's observation is in the tokens only if the episode was saved before it ended
    (training drops it); its mask-0 tokens tell.
    """
    end = len(trajectory.prompt_ids)
    spans = [_Span(0, "prompt", 0, end)]
    renders = [_Render("the prompt", list(opening), True, end, True)]
    history = list(opening)
    for number, turn in enumerate(trajectory.turns, start=1):
        history = [*history, {"role": "assistant", "content": turn.action_text}]
        spans.append(_Span(number, "sampled", end, end + len(turn.completion_ids)))
        end = spans[-1].end
        renders.append(_Render(f"the conversation through turn {number}", history, False, end, False))
        observation_end = end + len(turn.observation_ids)
        response_end = observation_end - len(trajectory.prompt_ids)
        appended = 0 < response_end <= len(trajectory.loss_mask) and not any(
            trajectory.loss_mask[end - len(trajectory.prompt_ids) : response_end]
        )
        if number < len(trajectory.turns) or (turn.observation_ids and appended):
            history = [*history, *turn.observation]
            spans.append(_Span(number, "observation", end, observation_end))
            end = observation_end
            renders.append(_Render(f"the context of turn {number + 1}", history, True, end, True))
    return spans, renders


def _compare(
    template: ChatTemplate, trained: list[int], sampled: list[int], rendered: list[int], whole: bool
) -> tuple[tuple[int, int] | None, list[tuple[int, int, int]]]:
    """First (trained index, rendered index) that differs, and the resplits passed on the way.

    `trained` must be a prefix of `rendered` (all of it if `whole`), up to resplits of sampled tokens.
    """
    index = rendered_index = 0
    resplits = []
    while index < len(trained) and rendered_index < len(rendered):
        if trained[index] == rendered[rendered_index]:
            index, rendered_index = index + 1, rendered_index + 1
            continue
        lengths = _same_text(template, trained[index:], rendered[rendered_index:])
        if lengths is None or not any(sampled[index : index + lengths[0]]):
            return (index, rendered_index), resplits
        resplits.append((index, *lengths))
        index, rendered_index = index + lengths[0], rendered_index + lengths[1]
    if index < len(trained) or (whole and rendered_index < len(rendered)):
        return (index, rendered_index), resplits
    return None, resplits


def _same_text(template: ChatTemplate, trained: list[int], rendered: list[int]) -> tuple[int, int] | None:
    """The shortest token spans at the start of both that decode to the same text, if any are short."""

    def texts(ids: list[int]) -> list[str]:
        decode = template.tokenizer.decode
        return [
            decode(ids[:n], skip_special_tokens=False) for n in range(1, min(len(ids), RESPLIT_WINDOW) + 1)
        ]

    rendered_lengths: dict[str, int] = {}
    for length, text in enumerate(texts(rendered), start=1):
        rendered_lengths.setdefault(text, length)
    for length, text in enumerate(texts(trained), start=1):
        if "\ufffd" not in text and text in rendered_lengths:  # partial UTF-8 bytes all decode to U+FFFD
            return length, rendered_lengths[text]
    return None


def _resplit(spans: list[_Span], index: int, num_trained: int, num_rendered: int) -> Resplit:
    turn = next((s.turn for s in spans if s.start <= index < s.end and s.part == "sampled"), None)
    if turn is None:  # the split starts on the context's last token and takes in sampled ones
        turn = next(s.turn for s in spans if s.part == "sampled" and s.start > index)
    return Resplit(turn, index, num_trained, num_rendered)
