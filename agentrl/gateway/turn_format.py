"""Gateway stage: the run's chat format as the gateway uses it, rendering in and parsing out.

Every render and parse the gateway does goes through `TurnFormat`: the prompt of a
conversation, the message a sampled turn becomes, where a sampled turn ends, and the reply's
content, reasoning and tool calls. It wraps the run's renderer (`agentrl.renderers`, a
`ChatTemplate` that knows its model family), so a conversation served here tokenizes exactly as
the rollout tokenizes it; a bare `ChatTemplate` gets the generic renderer's behaviour (the
template as it is, Hermes tool calls).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.engine.protocol import FinishReason, Generation
from agentrl.env.base import Message
from agentrl.parsing.tool_calls import HermesToolCallParser, MalformedCall, ParsedReply, ToolCall
from agentrl.renderers.reasoning import split_reasoning
from agentrl.rollout.chat_template import ChatTemplate, ObservationDelta
from agentrl.rollout.episode import SPECIAL_TOKEN_FINISH

_HERMES = HermesToolCallParser()


@dataclass(frozen=True)
class ParsedTurn:
    """One sampled assistant turn split into what a client API returns."""

    content: str  # the reply without reasoning and well-formed call blocks
    reasoning: str | None
    calls: tuple[ToolCall, ...]  # well-formed calls, in the order written
    malformed: tuple[MalformedCall, ...]  # call blocks that are not calls


@dataclass(frozen=True)
class SampledTurn:
    """The tokens of one turn as trained: cut where the template ends a turn."""

    completion_ids: list[int]  # [num_completion_tokens]
    logprobs: list[float]  # [num_completion_tokens]
    finish_reason: str  # FinishReason value, or SPECIAL_TOKEN_FINISH
    policy_version: int


class TurnFormat:
    """Renders conversations and parses replies with the run's renderer (or a bare chat template)."""

    def __init__(self, template: ChatTemplate) -> None:
        self.template = template

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """A turn ends at any special token, as in the rollout."""
        return tuple(sorted(self.template.special_token_ids))

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None) -> list[int]:
        return self.template.prompt_ids(messages, tools)

    def observation_delta(
        self,
        history: list[Message],
        completion_ids: list[int],
        observation: list[Message],
        tools: list[dict] | None,
    ) -> ObservationDelta:
        return self.template.observation_delta(history, completion_ids, observation, tools)

    def token_texts(self, token_ids: list[int]) -> list[str]:
        return [self.template.tokenizer.decode([token_id]) for token_id in token_ids]

    def cut(self, generation: Generation) -> SampledTurn:
        """The sampled turn as the rollout keeps it: up to a special token other than the end of turn."""
        ids, logprobs = generation.completion_ids, generation.logprobs
        finish_reason = generation.finish_reason.value
        kept = self.template.turn_length(ids)
        if kept < len(ids):
            ended = ids[kept - 1 : kept] == [self.template.end_of_turn_id]
            ids, logprobs = ids[:kept], logprobs[:kept]
            finish_reason = FinishReason.STOP.value if ended else SPECIAL_TOKEN_FINISH
        return SampledTurn(list(ids), list(logprobs), finish_reason, generation.policy_version)

    def turn_text(self, completion_ids: list[int]) -> str:
        """The turn's text as its assistant message holds it."""
        if hasattr(self.template, "turn_text"):  # a renderer keeps its family's markup tokens
            return self.template.turn_text(completion_ids)
        return self.template.tokenizer.decode(completion_ids, skip_special_tokens=True)

    def assistant_message(self, text: str) -> Message:
        """The message the template renders back to exactly the sampled turn."""
        if hasattr(self.template, "assistant_message"):
            return self.template.assistant_message(text)
        return {"role": "assistant", "content": text}

    def parse(self, text: str, parse_calls: bool = True) -> ParsedTurn:
        """Reasoning, content and tool calls of a turn (with parse_calls=False, call blocks stay text)."""
        reply: ParsedReply = (
            self.template.parse(text) if hasattr(self.template, "parse") else _HERMES.parse(text)
        )
        reasoning = reply.reasoning or None
        if not parse_calls:
            return ParsedTurn(
                split_reasoning(text)[1].strip() if reasoning else text.strip(), reasoning, (), ()
            )
        return ParsedTurn(reply.content, reasoning, tuple(reply.well_formed), tuple(reply.malformed))
