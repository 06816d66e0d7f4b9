"""Rollout stage: chat messages -> token ids without ever re-tokenizing what the model produced.

The prompt is rendered once. After each assistant turn the observation is appended as the
template's *delta*: the text the template puts after the model's last sampled token (the
end-of-turn newline, the tool/user turn, the next generation prompt) — so the token sequence
the policy trains on is exactly what it saw when sampling. A template that breaks the prefix
property (rendering more messages changes the text of earlier ones) is detected and counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

Message = dict[str, Any]


@dataclass(frozen=True)
class ObservationDelta:
    """Tokens to append after an assistant turn (all get loss mask 0)."""

    token_ids: list[int]  # [num_observation_tokens]
    prefix_ok: bool  # False: the template rewrote earlier text; the delta is a best effort


class ChatTemplate:
    """Renders conversations with a tokenizer's chat template, as text deltas."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if tokenizer.chat_template is None:
            raise ValueError(
                f"tokenizer {tokenizer.name_or_path!r} has no chat_template; use a chat model or set one"
            )
        self.tokenizer = tokenizer

    def render(self, messages: list[Message], tools: list[dict] | None, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None) -> list[int]:
        """Token ids of the opening messages followed by the generation prompt."""
        return self.encode(self.render(messages, tools, generation_prompt=True))

    def observation_delta(
        self,
        history: list[Message],
        completion_ids: list[int],
        observation: list[Message],
        tools: list[dict] | None,
    ) -> ObservationDelta:
        """Token ids that follow the sampled `completion_ids` once `observation` is appended.

        `history` ends with the assistant message whose content is the decoded completion.
        """
        closed = self.render(history, tools, generation_prompt=False)
        opened = self.render(history + observation, tools, generation_prompt=True)
        sampled_text = self.tokenizer.decode(completion_ids, skip_special_tokens=False)
        end_of_sample = closed.rfind(sampled_text) + len(sampled_text) if sampled_text else -1
        prefix_ok = opened.startswith(closed) and end_of_sample >= len(sampled_text) > 0
        if prefix_ok:
            return ObservationDelta(self.encode(opened[end_of_sample:]), prefix_ok=True)
        # Best effort: the tokens the full rendering has beyond the longest common token prefix.
        closed_ids, opened_ids = self.encode(closed), self.encode(opened)
        common = 0
        while common < min(len(closed_ids), len(opened_ids)) and closed_ids[common] == opened_ids[common]:
            common += 1
        return ObservationDelta(opened_ids[common:], prefix_ok=False)
