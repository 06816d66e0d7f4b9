"""Debugger: re-render a recorded trajectory with the chat template and find tokens that differ.

The dump has the exact tokens training used. Re-rendering the same conversation (the env's
opening messages for the row, then each recorded action and observation) through
`ChatTemplate` as the agent loop does must give the same ids; any difference is a token the
policy was trained on that a fresh rollout would not produce (a changed template or tokenizer,
a template that rewrites history, a corrupted dump).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class TokenDifference:
    """One position where the recorded token and the re-rendered token disagree."""

    turn: int  # 0: the prompt; k: turn k's sampled tokens or the observation after it
    position: int  # index in prompt + response
    trained_id: int | None  # None: the dump has fewer tokens here
    rendered_id: int | None  # None: the re-render has fewer tokens here


def _differences(turn: int, start: int, trained: list[int], rendered: list[int]) -> list[TokenDifference]:
    return [
        TokenDifference(
            turn,
            start + i,
            trained[i] if i < len(trained) else None,
            rendered[i] if i < len(rendered) else None,
        )
        for i in range(max(len(trained), len(rendered)))
        if i >= len(trained) or i >= len(rendered) or trained[i] != rendered[i]
    ]


def rerender_differences(
    template: ChatTemplate, opening: list[dict], tools: list[dict] | None, trajectory: Trajectory
) -> list[TokenDifference]:
    """Every token of `trajectory` that a re-render of its conversation does not reproduce."""
    prompt = template.prompt_ids(opening, tools)
    found = _differences(0, 0, trajectory.prompt_ids, prompt)
    offset = len(trajectory.prompt_ids)
    response, cursor, history = trajectory.response_ids, 0, list(opening)
    for number, turn in enumerate(trajectory.turns, start=1):
        completion = turn.completion_ids
        found += _differences(
            number, offset + cursor, response[cursor : cursor + len(completion)], completion
        )
        cursor += len(completion)
        if cursor >= len(response):  # the last turn: its observation (if any) was never appended
            break
        history.append(
            {"role": "assistant", "content": template.tokenizer.decode(completion, skip_special_tokens=True)}
        )
        delta = template.observation_delta(history, completion, turn.observation, tools)
        found += _differences(
            number, offset + cursor, response[cursor : cursor + len(turn.observation_ids)], delta.token_ids
        )
        cursor += len(turn.observation_ids)
        history += turn.observation
    return found
