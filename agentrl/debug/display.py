"""Debugger: what a person sees of an episode, as rich renderables.

A turn shows the rendered messages, a token table (position, id, loss mask, logprob, text;
low-probability sampled tokens flagged), the env's reward, status and info, the budgets used,
and a warning when the loop counted a template mismatch (the trained tokens no longer equal a full
render of the conversation; `--replay` of the saved episode shows where). Colours are for terminals; the same text, without them, is the non-interactive transcript.
"""

from __future__ import annotations

import json

from rich.console import Group
from rich.table import Table
from rich.text import Text

from agentrl.debug.session import Candidate
from agentrl.parsing.tool_calls import ToolCall
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.config import Budgets
from agentrl.rollout.trajectory import Status, Trajectory

LOW_LOGPROB = -2.5  # sampled tokens below this are flagged: where a policy was surprised


def messages_view(messages: list[dict]) -> Text:
    text = Text()
    for message in messages:
        text.append(f"{message['role']}: ", style="bold")
        text.append(f"{message.get('content', '')}\n")
    return text


def token_table(
    template: ChatTemplate, ids: list[int], mask: list[int], logprobs: list[float], start: int
) -> Table:
    """One row per token: position in the episode, id, loss mask, logprob and its text."""
    table = Table("pos", "id", "mask", "logprob", "token", box=None, pad_edge=False)
    for offset, (token_id, loss_mask, logprob) in enumerate(zip(ids, mask, logprobs, strict=True)):
        low = loss_mask == 1 and logprob < LOW_LOGPROB
        style = "bold red" if low else ("yellow" if loss_mask else "blue")
        shown = f"{logprob:.3f}" if loss_mask else "-"
        token = repr(template.tokenizer.decode([token_id], skip_special_tokens=False))
        table.add_row(
            str(start + offset),
            str(token_id),
            str(loss_mask),
            shown + (" LOW" if low else ""),
            token,
            style=style,
        )
    return table


def budgets_line(trajectory: Trajectory, budgets: Budgets, last_turn_tokens: int) -> str:
    used = len(trajectory.prompt_ids) + len(trajectory.response_ids)
    return (
        f"budgets: turns {len(trajectory.turns)}/{budgets.max_turns}, "
        f"episode tokens {used}/{budgets.max_tokens_per_episode}, "
        f"this turn {last_turn_tokens}/{budgets.max_new_tokens_per_turn} new tokens"
    )


def status_line(trajectory: Trajectory, done: bool) -> str:
    terminated = done and trajectory.status is Status.COMPLETED
    truncated = done and trajectory.status.is_truncated
    line = f"status: {trajectory.status.value if done else 'running'}, terminated={terminated}, truncated={truncated}"
    return line + (f", error: {trajectory.error}" if trajectory.error else "")


def turn_view(
    template: ChatTemplate,
    trajectory: Trajectory,
    messages: list[dict],
    budgets: Budgets,
    done: bool,
    start: int,
) -> Group:
    """The latest turn: messages so far, the tokens appended since `start` (a response index), results."""
    turn = trajectory.turns[-1] if trajectory.turns else None
    new_sample = turn is not None and turn.starts_new_sample and bool(trajectory.earlier_segments)
    # A turn that closed its sample has its tokens there; the live sample starts after it.
    sample = trajectory.earlier_segments[-1] if new_sample else trajectory
    end = len(sample.response_ids)
    position = len(sample.prompt_ids) + start
    parts = [
        Text(f"── turn {len(trajectory.turns)} ──", style="bold"),
        messages_view(messages),
        token_table(
            template,
            sample.response_ids[start:end],
            sample.loss_mask[start:end],
            sample.rollout_logprobs[start:end],
            position,
        ),
    ]
    if new_sample:
        parts.append(
            Text(
                f"── new sample: history rewritten ── the next turn is sampled from a full render of the "
                f"conversation ({len(trajectory.prompt_ids)} prompt tokens)",
                style="bold magenta",
            )
        )
    if turn is not None:
        parts.append(parsed_reply_view(template, turn.action_text))
        parts.append(
            Text(f"reward: {turn.reward:g} (episode {trajectory.reward:g}), finish: {turn.finish_reason}")
        )
    if trajectory.num_template_mismatches:
        parts.append(
            Text(
                f"template mismatch: the loop counted {trajectory.num_template_mismatches}; the trained "
                "tokens differ from a full render of the conversation (save, then --replay shows where)",
                style="bold red",
            )
        )
    parts += [
        Text(status_line(trajectory, done)),
        Text(f"info: {json.dumps(trajectory.info, default=str)}"),
        Text(budgets_line(trajectory, budgets, len(turn.completion_ids) if turn else 0)),
    ]
    return Group(*parts)


def parsed_reply_view(template: ChatTemplate, text: str) -> Text:
    """The turn as the model family's renderer parses it (what the env and the rewards read)."""
    parse = getattr(template, "parse", None)  # a bare ChatTemplate knows no family format
    if parse is None:
        return Text("")
    reply = parse(text)
    calls = [
        f"{call.name}({json.dumps(call.arguments)})"
        if isinstance(call, ToolCall)
        else f"MALFORMED {call.message}"
        for call in reply.calls
    ]
    lines = [f"parsed ({template.name}): {len(reply.reasoning)} characters of reasoning"]
    lines += [f"  call: {call}" for call in calls] or ["  no tool calls"]
    return Text("\n".join(lines))


def prompt_view(template: ChatTemplate, trajectory: Trajectory, messages: list[dict], done: bool) -> Group:
    return Group(
        Text("── prompt ──", style="bold"),
        messages_view(messages),
        Text(f"{len(trajectory.prompt_ids)} prompt tokens (mask 0)"),
        Text(status_line(trajectory, done)),
    )


def candidates_view(template: ChatTemplate, candidates: list[Candidate]) -> Group:
    """k samples of one turn side by side (text, tokens, logprobs, finish, reward, status), then
    the env's info for each: why a reward is what it is."""
    table = Table("#", "text", "tokens", "mean logprob", "min logprob", "finish", "reward", "status")
    for index, candidate in enumerate(candidates):
        generation = candidate.generation
        text = template.tokenizer.decode(generation.completion_ids, skip_special_tokens=True)
        mean = sum(generation.logprobs) / max(len(generation.logprobs), 1)
        table.add_row(
            str(index),
            text,
            str(len(generation.completion_ids)),
            f"{mean:.3f}",
            f"{min(generation.logprobs, default=0.0):.3f}",
            candidate.finish_reason,
            "-" if candidate.reward is None else f"{candidate.reward:g}",
            candidate.status,
        )
    infos = [
        Text(f"{index}: info {json.dumps(candidate.info, default=str)}")
        for index, candidate in enumerate(candidates)
    ]
    return Group(table, *infos)
