"""Gateway stage: a session's calls as training samples, by the extend-or-segment rule.

Each call's conversation is rendered in full. If those tokens extend the previous call's prompt +
completion, the call joins that token stream: the tokens beyond it are the messages the client
added (observations, loss mask 0), as in the rollout's `Episode`. If not, the live sample is
closed into `Trajectory.earlier_segments` and the call starts a new one from its render, and the
call's record says why: the first message that differs, the tools, or an assistant turn the
client sent back altered. `rollout.trajectory_mode` applies as in the rollout (segments: a new
sample every call; single: never split, a best-effort delta counted as a template mismatch).

Assistant turns this session served are recognised by `fingerprint` (text and calls, whatever
the dialect or serialisation) and rendered from the text the model sampled, so a faithful
client's conversation renders to what was sampled; an altered one renders as sent and is
prompt, never trained. Loss mask 1 is only ever set on tokens the engine sampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl.env.base import Message
from agentrl.gateway.conversation import CallReply, CallRequest, fingerprint
from agentrl.gateway.turn_format import SampledTurn, TurnFormat
from agentrl.rollout.config import Budgets, TrajectoryMode
from agentrl.rollout.episode import CHARS_PER_TOKEN_BOUND
from agentrl.rollout.trajectory import Status, Trajectory, Turn


class SessionEnded(Exception):
    """A budget (or the engine) ended the session: the call is refused and the episode has this status."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class PreparedCall:
    """Where a call's prompt comes from, decided before anything is generated or recorded."""

    context_ids: list[int]  # [num_context_tokens] what the engine is given
    observation_ids: (
        list[int] | None
    )  # [num_observation_tokens] appended to the live sample; None: new sample
    why_new_sample: str | None  # None for the first call and for calls that join
    altered_turns: list[int]  # indices of assistant messages the client sent back altered
    messages: list[Message]  # the conversation, served turns as sampled

    @property
    def joined(self) -> bool:
        return self.observation_ids is not None


@dataclass
class CallRecord:
    """One model call of a session, as served and as trained."""

    dialect: str
    model: str  # the model name the client sent
    prompt_ids: list[int]  # [num_prompt_tokens] what the engine was given
    completion_ids: list[int]  # [num_completion_tokens] what it sampled (the kept part)
    logprobs: list[float]  # [num_completion_tokens]
    policy_version: int
    finish_reason: str
    sample: int  # which trained sample of the episode holds it (0 = the first)
    joined: bool  # its prompt extended the previous call's prompt + completion
    why_new_sample: str | None = None
    altered_turns: list[int] = field(default_factory=list)
    requested: dict[str, Any] = field(default_factory=dict)  # sampling the client asked for


class SessionTrajectory:
    """The trajectory one session's calls build, one call at a time."""

    def __init__(self, turn_format: TurnFormat, budgets: Budgets, group_id: int) -> None:
        self.format, self.budgets = turn_format, budgets
        self.trajectory = Trajectory(group_id=group_id, prompt_ids=[])
        self.calls: list[CallRecord] = []
        self._messages: list[Message] = []  # the live conversation, ending on the last served turn
        self._tools: list[dict[str, Any]] | None = None
        self._served: dict[str, Message] = {}  # fingerprint of a served turn -> its message as sampled

    def prepare(self, request: CallRequest) -> PreparedCall:
        """The call's context, or SessionEnded when a budget refuses it."""
        if len(self.calls) >= self.budgets.max_turns:
            raise SessionEnded(
                Status.TRUNCATED_TURNS, f"max_turns={self.budgets.max_turns} calls were served"
            )
        budget = self.budgets.max_tokens_per_episode
        num_chars = sum(len(str(value)) for message in request.messages for value in message.values())
        if num_chars > budget * CHARS_PER_TOKEN_BOUND:  # never tokenized: it cannot fit
            raise SessionEnded(
                Status.TRUNCATED_TOKENS,
                f"the request's {num_chars} characters exceed max_tokens_per_episode={budget} tokens",
            )
        messages, altered = self._as_sampled(request.messages)
        prepared = self._extend(messages, request.tools, altered)
        if prepared.observation_ids and len(prepared.observation_ids) > self.budgets.max_observation_tokens:
            raise SessionEnded(
                Status.TRUNCATED_OBSERVATION,
                f"the messages added since the last call are {len(prepared.observation_ids)} tokens, more "
                f"than rollout.max_observation_tokens={self.budgets.max_observation_tokens}",
            )
        if self.room(prepared) <= 0:
            raise SessionEnded(
                Status.TRUNCATED_TOKENS,
                f"the prompt is {len(prepared.context_ids)} tokens and leaves no room under {self._budget_names()}",
            )
        return prepared

    def room(self, prepared: PreparedCall) -> int:
        """Tokens the call may generate within the turn and episode budgets."""
        live = len(prepared.context_ids)
        room = min(self.budgets.max_new_tokens_per_turn, self.budgets.max_tokens_per_episode - live)
        if self.budgets.max_total_tokens_per_episode is not None:
            closed = self._num_closed_tokens() + (
                0 if prepared.joined or not self.calls else self._num_live_tokens()
            )
            room = min(room, self.budgets.max_total_tokens_per_episode - closed - live)
        return room

    def commit(self, request: CallRequest, prepared: PreparedCall, sampled: SampledTurn) -> CallReply:
        """Record the call's tokens (observation mask 0, sampled mask 1) and the reply it serves."""
        trajectory = self.trajectory
        if prepared.joined:
            ids = prepared.observation_ids or []
            trajectory.append_observation(ids)
            trajectory.turns[-1].observation = prepared.messages[len(self._messages) :]
            trajectory.turns[-1].observation_ids = ids
        else:
            if self.calls:  # the live sample (it ends on sampled tokens) is closed; a new one starts
                trajectory.turns[-1].starts_new_sample = True
            trajectory.start_sample(prepared.context_ids)
        trajectory.append_sampled(sampled.completion_ids, sampled.logprobs, sampled.policy_version)
        trajectory.policy_version = sampled.policy_version
        text = self.format.turn_text(sampled.completion_ids)
        trajectory.turns.append(
            Turn(text, sampled.completion_ids, [], [], 0.0, sampled.finish_reason, sampled.policy_version)
        )
        self.calls.append(
            CallRecord(
                request.dialect, request.model, list(prepared.context_ids), sampled.completion_ids,
                sampled.logprobs, sampled.policy_version, sampled.finish_reason,
                len(trajectory.earlier_segments), prepared.joined, prepared.why_new_sample,
                prepared.altered_turns,
                {"max_tokens": request.max_tokens, "temperature": request.temperature, "top_p": request.top_p},
            )
        )  # fmt: skip
        reply = CallReply.of(
            self.format.parse(text, request.parse_tool_calls), request.model, len(prepared.context_ids),
            sampled.finish_reason,
        )  # fmt: skip
        reply.token_texts.extend(self.format.token_texts(sampled.completion_ids))
        reply.logprobs.extend(sampled.logprobs)
        served = self.format.assistant_message(text)
        self._served[fingerprint(reply.message())] = served
        self._messages = [*prepared.messages, served]
        self._tools = request.tools
        return reply

    def _as_sampled(self, messages: list[Message]) -> tuple[list[Message], list[int]]:
        """Served assistant turns replaced by their sampled form; the indices of the other assistant turns."""
        converted, altered = [], []
        for index, message in enumerate(messages):
            if message["role"] == "assistant":
                served = self._served.get(fingerprint(message))
                if served is not None:
                    message = served
                elif self._served:  # a conversation seeded with assistant turns is only prompt
                    altered.append(index)
            converted.append(message)
        return converted, altered

    def _extend(self, messages: list[Message], tools: list[dict] | None, altered: list[int]) -> PreparedCall:
        """Join the live sample where the render extends it (per trajectory_mode); else a new sample."""
        full = self.format.prompt_ids(messages, tools)
        if not self.calls:
            return PreparedCall(full, None, None, altered, messages)
        live_ids = self.trajectory.prompt_ids + self.trajectory.response_ids
        mode = self.budgets.trajectory_mode
        extends = len(full) > len(live_ids) and full[: len(live_ids)] == live_ids
        if extends and mode is not TrajectoryMode.SEGMENTS:
            return PreparedCall(full, full[len(live_ids) :], None, altered, messages)
        why = "rollout.trajectory_mode=segments" if extends else self._why_not(messages, tools, altered)
        if mode is TrajectoryMode.SINGLE:
            self.trajectory.num_template_mismatches += 1
            delta = self._best_effort_delta(messages, tools, live_ids, full)
            return PreparedCall(live_ids + delta, delta, why, altered, messages)
        return PreparedCall(full, None, why, altered, messages)

    def _best_effort_delta(
        self, messages: list[Message], tools: list[dict] | None, live_ids: list[int], full: list[int]
    ) -> list[int]:
        """trajectory_mode=single: the template's delta, or the render beyond the common token prefix."""
        live = self._messages
        if tools == self._tools and messages[: len(live)] == live and len(messages) > len(live):
            completion_ids = self.trajectory.turns[-1].completion_ids
            return self.format.observation_delta(live, completion_ids, messages[len(live) :], tools).token_ids
        common = 0
        while common < min(len(live_ids), len(full)) and live_ids[common] == full[common]:
            common += 1
        return full[common:]

    def _why_not(self, messages: list[Message], tools: list[dict] | None, altered: list[int]) -> str:
        live = self._messages
        if tools != self._tools:
            return "the tools differ from the previous call's"
        for index, (sent, before) in enumerate(zip(messages, live, strict=False)):
            if sent != before:
                if index in altered:
                    return f"message {index}: an assistant turn sent back altered (trimmed or re-serialised)"
                return f"message {index} differs from what the previous call sent (history rewritten)"
        if len(messages) <= len(live):
            return "the conversation does not extend the previous call's (messages removed or none added)"
        return "the template renders the conversation differently from the tokens sampled"

    def _num_live_tokens(self) -> int:
        return len(self.trajectory.prompt_ids) + len(self.trajectory.response_ids)

    def _num_closed_tokens(self) -> int:
        return sum(len(s.prompt_ids) + len(s.response_ids) for s in self.trajectory.earlier_segments)

    def _budget_names(self) -> str:
        names = f"max_tokens_per_episode={self.budgets.max_tokens_per_episode}"
        if self.budgets.max_total_tokens_per_episode is not None:
            names += f", max_total_tokens_per_episode={self.budgets.max_total_tokens_per_episode}"
        return names
