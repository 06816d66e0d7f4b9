"""Checks that every trained sample of an episode is a full render of its contexts, and the
templates and envs that rewrite history which the checks run against."""

from __future__ import annotations

import copy
from typing import ClassVar

from agentrl.env.base import TextEnv
from agentrl.rollout.trajectory import Trajectory

# The bundled ChatML template, with one change in the way of Qwen3's: an assistant turn before the
# last user message loses its `<think>...</think>` part when the conversation is rendered again.
THINK_STRIPPING_TEMPLATE = """
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content %}
    {%- if message.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}
        {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
    {%- endif %}
    {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def think_stripping(tokenizer):
    """A copy of `tokenizer` whose chat template drops earlier turns' reasoning."""
    rewriting = copy.deepcopy(tokenizer)
    rewriting.chat_template = THINK_STRIPPING_TEMPLATE
    return rewriting


def render_ids(tokenizer, messages) -> list[int]:
    """The full render of `messages` with the generation prompt, as the tokenizer's own call gives it."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def turn_contexts(trajectory: Trajectory, opening, histories=None) -> list[list[dict]]:
    """The conversation each turn was sampled from; `histories[k]`: what step k rewrote it to."""
    histories = histories or {}
    contexts, messages = [], list(opening)
    for index, turn in enumerate(trajectory.turns):
        contexts.append(messages)
        assert turn.rewritten_history == histories.get(index)
        messages = histories.get(index, [*messages, {"role": "assistant", "content": turn.action_text}])
        messages = [*messages, *turn.observation]
    return contexts


def assert_samples_are_renders(trajectory: Trajectory, tokenizer, contexts: list[list[dict]]) -> None:
    """Every sampled turn sits in its sample right after the exact render of its context.

    A sample's loss-mask runs are its turns in order; the samples together hold every turn once.
    """
    turn_index = 0
    for sample in trajectory.samples():
        tokens = sample.prompt_ids + sample.response_ids
        mask = [0] * len(sample.prompt_ids) + sample.loss_mask
        assert mask[-1] == 1, "a sample ends on a sampled token"
        position = 0
        while position < len(tokens):
            if mask[position] == 0:
                position += 1
                continue
            turn = trajectory.turns[turn_index]
            assert tokens[:position] == render_ids(tokenizer, contexts[turn_index]), f"turn {turn_index}"
            end = position + len(turn.completion_ids)
            assert tokens[position:end] == turn.completion_ids and all(mask[position:end])
            position, turn_index = end, turn_index + 1
    assert turn_index == len(trajectory.turns)


class CompactingEnv(TextEnv):
    """Asks for numbers; at step `compact_at` it replaces the conversation with a short summary."""

    OPENING: ClassVar[list[dict]] = [
        {"role": "system", "content": "Count with me."},
        {"role": "user", "content": "Say a number."},
    ]

    def __init__(self, num_steps: int = 3, compact_at: int = 2, history=None) -> None:
        super().__init__()
        self.num_steps, self.compact_at, self.history = num_steps, compact_at, history

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.step_count = 0
        return list(self.OPENING), {}

    def step(self, action):
        self.step_count += 1
        info = {}
        if self.step_count == self.compact_at:
            info["history"] = self.summary() if self.history is None else self.history
        done = self.step_count >= self.num_steps
        return ([] if done else [{"role": "user", "content": "Another."}]), 0.0, done, False, info

    def summary(self) -> list[dict]:
        return [*self.OPENING, {"role": "assistant", "content": f"({self.step_count} numbers said)"}]
