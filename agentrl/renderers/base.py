"""Rollout stage, per model family: messages and tools -> token ids, and a completion -> a reply.

A `Renderer` is a `ChatTemplate` (the agent loop drives it through the same methods) that knows
its model family:

- it renders through the family's own chat template with the family's template variables
  (`template_kwargs`, e.g. Qwen3's `enable_thinking`);
- it parses a completion's text into content, reasoning and tool calls (`parse`, the family's
  `parser`); calls written inside the reasoning are not calls;
- it names the tokens a sampled turn stops on (`stop_token_ids`) and the family's markup tokens
  a turn may contain (`markup_tokens`: `[TOOL_CALLS]`, `<|python_tag|>`, harmony's channels),
  which are special to the tokenizer but part of the turn's text (`turn_text`);
- it builds the bridge to the next turn: the assistant message the template renders for a
  sampled turn (`assistant_message`) and the observation delta that follows it
  (`observation_delta`, whose `prefix_ok` is False where the template rewrites history).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from typing import Any, ClassVar

from transformers import PreTrainedTokenizerBase

from agentrl.parsing.tool_calls import HermesToolCallParser, ParsedReply, ToolCall, ToolCallParser
from agentrl.rollout.chat_template import ChatTemplate, Message, ObservationDelta


class Renderer(ChatTemplate):
    """The generic renderer: the tokenizer's own template, Hermes `<tool_call>` blocks.

    A family subclasses it, naming its `name`, `parser`, `markup_tokens` and `template_kwargs`
    and, where its template renders tool calls from a message's structure rather than its text,
    overriding `assistant_message` (Hermes templates take the text as content, as ChatTemplate does).
    """

    name: ClassVar[str] = "generic"
    parser: ClassVar[ToolCallParser] = HermesToolCallParser()
    markup_tokens: ClassVar[tuple[str, ...]] = ()  # special tokens that belong to a turn's text
    extra_stop_tokens: ClassVar[tuple[str, ...]] = ()  # besides the end of turn (e.g. <|eom_id|>)
    default_template_kwargs: ClassVar[dict[str, Any]] = {}
    needs_generation_prompt: ClassVar[bool] = True  # False: the model writes right after the user turn

    def __init__(self, tokenizer: PreTrainedTokenizerBase, **template_kwargs: Any) -> None:
        super().__init__(tokenizer)
        self.template_kwargs = {**self.default_template_kwargs, **template_kwargs}

    # -- (b) parsing --

    def parse(self, text: str) -> ParsedReply:
        """The reply's content, reasoning and tool calls; never raises on model output."""
        return self.parser.parse(text)

    # -- (c) stop tokens and the text of a turn --

    @cached_property
    def markup_token_ids(self) -> frozenset[int]:
        vocab = self.tokenizer.get_vocab()
        return frozenset(vocab[token] for token in self.markup_tokens if token in vocab)

    @cached_property
    def special_token_ids(self) -> frozenset[int]:
        """Special tokens that end a sampled turn: all but the family's markup tokens."""
        return ChatTemplate.special_token_ids.func(self) - self.markup_token_ids  # type: ignore[attr-defined]

    @cached_property
    def stop_token_ids(self) -> tuple[int, ...]:
        """The tokens a sampled turn of this family ends on: the end-of-turn token, EOS, extras."""
        vocab = self.tokenizer.get_vocab()
        ids = [self.end_of_turn_id, self.tokenizer.eos_token_id]
        ids += [vocab.get(token) for token in self.extra_stop_tokens]
        return tuple(sorted({i for i in ids if i is not None}))

    def turn_text(self, completion_ids: list[int]) -> str:
        """The text of a sampled turn: its tokens decoded, markup tokens kept, other special ones dropped."""
        kept = [i for i in completion_ids if i in self.markup_token_ids or i not in self.special_token_ids]
        return self.tokenizer.decode(kept, skip_special_tokens=False)

    # -- (d) the bridge to the next turn --

    def observation_delta(
        self,
        history: list[Message],
        completion_ids: list[int],
        observation: list[Message],
        tools: list[dict] | None,
    ) -> ObservationDelta:
        """Token ids that follow the sampled `completion_ids` once `observation` is appended.

        The template appends when the full rendering of the conversation extends the sampled
        context plus the sampled tokens; that one condition covers both templates that close a
        turn with an end token the model sampled (ChatML) and those whose next turn starts with
        the token the model stopped on (GLM's `<|observation|>`).
        """
        context = self.render(history[:-1], tools, generation_prompt=True)
        opened = self.render(history + observation, tools, generation_prompt=True)
        sampled = context + self.tokenizer.decode(completion_ids, skip_special_tokens=False)
        if opened.startswith(sampled):
            return ObservationDelta(self.encode(opened[len(sampled) :]), prefix_ok=True)
        delta = super().observation_delta(history, completion_ids, observation, tools)
        return replace(delta, prefix_ok=False)


def structured_message(reply: ParsedReply, **extra: Any) -> Message:
    """An assistant message with OpenAI-style `tool_calls`, for templates that render calls from it."""
    message: Message = {"role": "assistant", "content": reply.content, **extra}
    calls = [call for call in reply.calls if isinstance(call, ToolCall)]
    if calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in calls
        ]
    return message
