"""Rollout stage: chat messages -> token ids without ever re-tokenizing what the model produced.

The prompt is rendered once. After each assistant turn the observation is appended as the
template's *delta*: the text the template puts after the model's last sampled token (the
end-of-turn newline, the tool/user turn, the next generation prompt) — so the token sequence
the policy trains on is exactly what it saw when sampling. A template that breaks the prefix
property (rendering more messages changes the text of earlier ones) is detected and counted.

Special tokens are the template's structure (turn starts and ends, end of text). A sampled turn
may end on the template's end-of-turn token; any other special token in it cannot be rendered from
the turn's message, whose text is decoded without special tokens (see `agentrl.rollout.episode`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
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
        # Extra variables the template reads (Qwen3's `enable_thinking`, ...); a model family's
        # renderer (agentrl.renderers) sets them, so every render of a run passes the same ones.
        self.template_kwargs: dict[str, Any] = {}

    def render(self, messages: list[Message], tools: list[dict] | None, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt,
            **self.template_kwargs,
        )  # fmt: skip

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    @cached_property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of the tokenizer's special tokens (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>`, ...)."""
        added = {i for i, token in self.tokenizer.added_tokens_decoder.items() if token.special}
        return frozenset(added | set(self.tokenizer.all_special_ids))

    @cached_property
    def end_of_turn_text(self) -> str | None:
        """The text the template puts after an assistant message's content (None: it rewrote the probe)."""
        marker = "Sentinel reply 8151."  # text no template rewrites
        opening = [{"role": "user", "content": "Hi."}]
        finished = self.render([*opening, {"role": "assistant", "content": marker}], None, False)
        return finished[finished.find(marker) + len(marker) :] if marker in finished else None

    @cached_property
    def end_of_turn_id(self) -> int | None:
        """The special token the template puts right after an assistant message's text, if any."""
        after = self.encode(self.end_of_turn_text or "")
        return after[0] if after and after[0] in self.special_token_ids else None

    def turn_length(self, completion_ids: list[int]) -> int:
        """How many sampled tokens form the turn: up to its first special token, kept if it is the
        template's end-of-turn token (the turn ended there), dropped otherwise."""
        for index, token_id in enumerate(completion_ids):
            if token_id in self.special_token_ids:
                return index + (token_id == self.end_of_turn_id)
        return len(completion_ids)

    def turn_text(self, completion_ids: list[int]) -> str:
        """The text of a sampled turn, as the env reads it: its tokens decoded without special ones."""
        return self.tokenizer.decode(completion_ids, skip_special_tokens=True)

    def assistant_message(self, text: str) -> Message:
        """The message the template renders for a sampled turn whose text is `text`."""
        return {"role": "assistant", "content": text}

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
        # The sample sits right after the context it was sampled from (a search for its text could
        # match elsewhere, and cannot place an empty sample).
        context = self.render(history[:-1], tools, generation_prompt=True)
        closed = self.render(history, tools, generation_prompt=False)
        opened = self.render(history + observation, tools, generation_prompt=True)
        sampled_text = self.tokenizer.decode(completion_ids, skip_special_tokens=False)
        end_of_sample = len(context) + len(sampled_text)
        prefix_ok = opened.startswith(closed) and closed.startswith(context + sampled_text)
        if prefix_ok:
            return ObservationDelta(self.encode(opened[end_of_sample:]), prefix_ok=True)
        # Best effort: the tokens the full rendering has beyond the longest common token prefix.
        closed_ids, opened_ids = self.encode(closed), self.encode(opened)
        common = 0
        while common < min(len(closed_ids), len(opened_ids)) and closed_ids[common] == opened_ids[common]:
            common += 1
        return ObservationDelta(opened_ids[common:], prefix_ok=False)
