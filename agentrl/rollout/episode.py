"""Rollout stage: one episode stepped turn by turn, token in and token out.

`Episode` is the agent loop's body with the loop taken out, so the training rollout
(`run_episode`) and the interactive debugger drive exactly the same code:

    episode = Episode(env, engine, template, row, group_id=0, seed=1, sampling_seed=2,
                      budgets=budgets, sampling=sampling)
    await episode.reset()
    while not episode.done:
        await episode.commit(await episode.generate())

Model tokens are appended exactly as sampled (loss mask 1, with their rollout logprobs). After
each turn the next context (the conversation, the observation and the generation prompt) is
rendered in full: if its tokens extend the live sample, the extension is appended (loss mask 0);
if not (a template that drops earlier reasoning, an env that rewrites the history through
`info["history"]`), the live sample is closed into `Trajectory.earlier_segments` and a new one
starts from the full render (`rollout.trajectory_mode` picks when). So every sample's tokens up
to each sampled turn are exactly a render of that turn's context. Every env return is validated
where it enters. Failures become the trajectory's status, typed by the boundary where they
happened: the env raised or returned a malformed value (env_error), the env's infrastructure
raised `InfraError` (sandbox_error), the engine raised (engine_error), a budget ran out
(truncated_*). No method raises for any of them.

Env code runs off the agent loop (`agentrl.env.calls`): an env that blocks, ignores cancellation
or raises `SystemExit` ends its own episode and nothing else. An observation longer than
`max_observation_tokens` ends the episode truncated_observation; one with more characters than
any tokenizer fits into that many tokens is never rendered or tokenized, and only its start is
kept in the turn's record, so a runaway tool output costs milliseconds and a small record.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from agentrl.engine.protocol import FinishReason, Generation, InferenceEngine, SamplingParams
from agentrl.env.base import Message, TextEnv
from agentrl.env.calls import EnvCallTimeout, call_env
from agentrl.env.errors import EnvAborted, InfraError
from agentrl.env.validation import HISTORY_INFO_KEY, check_reset_return, check_step_return
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.config import Budgets, Sampling, TrajectoryMode
from agentrl.rollout.trajectory import Status, Trajectory, Turn

_T = TypeVar("_T")

# Characters per token no tokenizer exceeds on average over a long text (real text: 2-5), so a
# text longer than max_tokens * CHARS_PER_TOKEN_BOUND has more than max_tokens tokens for sure.
CHARS_PER_TOKEN_BOUND = 16
PREVIEW_CHARS = 2000  # of each message of an observation too long to keep, in the turn's record

# Turn.finish_reason of a turn that sampled a special token other than a final end-of-turn token
# (e.g. `<|im_start|>` mid-turn): the turn ends before it, and the template closes the turn.
SPECIAL_TOKEN_FINISH = "special_token"


class EpisodeOver(Exception):
    """Raised inside Episode when a boundary failure or budget ends the episode."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status


class Episode:
    """One episode of `env` on the task `row`, advanced one assistant turn at a time."""

    def __init__(
        self,
        env: TextEnv,
        engine: InferenceEngine,
        template: ChatTemplate,
        row: dict[str, Any],
        *,
        group_id: int,
        seed: int,
        sampling_seed: int,
        budgets: Budgets,
        sampling: Sampling,
    ) -> None:
        self.env, self.engine, self.template, self.row = env, engine, template, row
        self.seed, self.sampling_seed, self.budgets, self.sampling = seed, sampling_seed, budgets, sampling
        self.trajectory = Trajectory(group_id=group_id, prompt_ids=[])
        self.messages: list[Message] = []  # the conversation so far, as the template renders it
        self.done = False

    @property
    def num_tokens(self) -> int:
        """Tokens of the live sample: the context the engine sees next."""
        return len(self.trajectory.prompt_ids) + len(self.trajectory.response_ids)

    @property
    def room(self) -> int:
        """Tokens the episode budgets still allow: in the live sample, and in total if capped."""
        return self._room(self.num_tokens, self._num_closed_tokens())

    def _room(self, num_live_tokens: int, num_closed_tokens: int) -> int:
        room = self.budgets.max_tokens_per_episode - num_live_tokens
        total_cap = self.budgets.max_total_tokens_per_episode
        if total_cap is not None:
            room = min(room, total_cap - num_closed_tokens - num_live_tokens)
        return room

    def _num_closed_tokens(self) -> int:
        return sum(len(s.prompt_ids) + len(s.response_ids) for s in self.trajectory.earlier_segments)

    async def reset(self) -> None:
        """Reset the env on the task and render the prompt; a failure ends the episode as env_error."""
        try:
            messages, _ = await self._env_call("reset", check_reset_return, seed=self.seed, options=self.row)
            num_chars, budget = _num_chars(messages), self.budgets.max_tokens_per_episode
            if num_chars > budget * CHARS_PER_TOKEN_BOUND:  # never tokenized: the prompt cannot fit
                message = f"reset's messages have {num_chars} characters, more than {budget} tokens can hold"
                self.finish(Status.TRUNCATED_TOKENS, f"{message} (max_tokens_per_episode={budget})")
                return
            self.trajectory.prompt_ids = self._render(
                lambda: self.template.prompt_ids(messages, self.env.tools)
            )
            self.messages = list(messages)
        except EpisodeOver as over:
            # Without a prompt there is nothing to train on or retry within the budget: an env error.
            self.finish(Status.ENV_ERROR if over.status is Status.TRUNCATED_TIME else over.status, str(over))
        else:
            self._check_room()

    async def generate(self, sampling: Sampling | None = None, seed: int | None = None) -> Generation | None:
        """Sample the next assistant turn without committing it; None (and done) if the engine failed."""
        sampling = sampling or self.sampling
        params = SamplingParams(
            max_new_tokens=min(self.budgets.max_new_tokens_per_turn, self.room),
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            seed=self.sampling_seed + len(self.trajectory.turns) if seed is None else seed,
            stop_token_ids=tuple(sorted(self.template.special_token_ids)),  # a turn ends at any of them
        )
        try:
            return await self.engine.generate(
                self.trajectory.prompt_ids + self.trajectory.response_ids, params
            )
        except Exception as exc:  # noqa: BLE001  # any engine failure is this trajectory's engine_error
            self.finish(Status.ENGINE_ERROR, f"engine: {type(exc).__name__}: {exc}")
            return None

    async def commit(self, generation: Generation | None) -> Turn | None:
        """Append the sampled tokens, step the env with their text, append the observation delta."""
        if generation is None or self.done:
            return None
        finish_reason = generation.finish_reason.value
        # Only the text of a turn enters its message, so a special token in it (other than a final
        # end-of-turn) could never be rendered again: the turn ends before it, trained as sampled
        # so far, and the template closes it (mask 0) as it closes a turn cut by max_new_tokens.
        kept = self.template.turn_length(generation.completion_ids)
        if kept < len(generation.completion_ids):
            ids, logprobs = generation.completion_ids[:kept], generation.logprobs[:kept]
            ended = ids[-1:] == [self.template.end_of_turn_id]  # on the end-of-turn token, as a stop
            generation = Generation(ids, logprobs, FinishReason.STOP, generation.policy_version)
            finish_reason = FinishReason.STOP.value if ended else SPECIAL_TOKEN_FINISH
        trajectory = self.trajectory
        trajectory.policy_version = generation.policy_version
        trajectory.append_sampled(generation.completion_ids, generation.logprobs, generation.policy_version)
        text = self.template.turn_text(generation.completion_ids)  # a family's markup tokens kept
        try:
            observation, reward, terminated, truncated, info = await self._env_call(
                "step", functools.partial(check_step_return, reward_bound=self.budgets.reward_bound), text
            )
        except EpisodeOver as over:
            self.finish(over.status, str(over))
            return None
        observation, too_long = self._bounded(observation)
        turn = Turn(
            text, generation.completion_ids, observation, [], reward, finish_reason, generation.policy_version,
        )  # fmt: skip
        trajectory.turns.append(turn)
        trajectory.reward += reward
        history = info.pop(HISTORY_INFO_KEY, None)  # the env's rewrite of the conversation, if any
        trajectory.info.update(info)
        self.messages.append(self.template.assistant_message(text))
        if history is not None:
            turn.rewritten_history, self.messages = history, list(history)
        if terminated or truncated:
            self.finish(Status.COMPLETED if terminated else Status.TRUNCATED_ENV)
        elif generation.finish_reason is FinishReason.LENGTH and self.room <= 0:
            self.finish(Status.TRUNCATED_TOKENS)
        elif len(trajectory.turns) >= self.budgets.max_turns:
            self.finish(Status.TRUNCATED_TURNS)
        else:
            self._append_observation(turn, observation, too_long, rewritten=history is not None)
        return turn

    def finish(self, status: Status, message: str | None = None) -> None:
        """End the episode with `status`; a response always ends on a sampled token."""
        if self.done:
            return
        trajectory = self.trajectory
        trajectory.status = status
        if message is not None:
            if status.is_error:
                trajectory.error = message
            else:
                trajectory.info["truncation"] = message
        trajectory.drop_unanswered_observation()
        self.done = True

    async def run(self) -> Trajectory:
        """Step to the end (the training rollout); the caller bounds the wall time."""
        await self.reset()
        while not self.done:
            await self.commit(await self.generate())
        return self.trajectory

    def _bounded(self, observation: list[Message]) -> tuple[list[Message], str | None]:
        """The observation, or only its start and why when it is too long to ever tokenize."""
        limit = self.budgets.max_observation_tokens
        num_chars = _num_chars(observation)
        if num_chars <= limit * CHARS_PER_TOKEN_BOUND:
            return observation, None
        preview = [
            {**message, "content": _preview(message["content"])} if len(message["content"]) > PREVIEW_CHARS
            else message
            for message in observation
        ]  # fmt: skip
        return preview, (
            f"env step returned an observation of {num_chars} characters, more than "
            f"rollout.max_observation_tokens={limit} tokens can hold"
        )

    def _append_observation(
        self, turn: Turn, observation: list[Message], too_long: str | None, rewritten: bool
    ) -> None:
        """Continue the episode with the next context: appended to the live sample, or a new sample."""
        if too_long is not None:
            self.finish(Status.TRUNCATED_OBSERVATION, too_long)
            return
        if rewritten and (history_too_long := self._too_long(self.messages)) is not None:
            self.finish(Status.TRUNCATED_TOKENS, history_too_long)
            return
        try:
            context_ids = self._render(
                lambda: self.template.prompt_ids(self.messages + observation, self.env.tools)
            )
        except EpisodeOver as over:
            self.finish(over.status, str(over))
            return
        trajectory, mode = self.trajectory, self.budgets.trajectory_mode
        live_ids = trajectory.prompt_ids + trajectory.response_ids
        extends = context_ids[: len(live_ids)] == live_ids
        if extends and mode is not TrajectoryMode.SEGMENTS:
            delta_ids = context_ids[len(live_ids) :]
        elif mode is TrajectoryMode.SINGLE:
            delta_ids, exact = self._best_effort_delta(turn, observation, live_ids, context_ids, rewritten)
            trajectory.num_template_mismatches += not exact
        else:
            delta_ids = None  # a new sample
        num_observation_tokens = (
            len(delta_ids) if delta_ids is not None else len(context_ids) - self._closed_length()
        )
        if num_observation_tokens > self.budgets.max_observation_tokens:
            self.finish(
                Status.TRUNCATED_OBSERVATION,
                f"env step returned an observation of {num_observation_tokens} tokens, more than "
                f"rollout.max_observation_tokens={self.budgets.max_observation_tokens}",
            )
            return
        self.messages += observation
        if delta_ids is None:
            self._start_new_sample(turn, context_ids)
            return
        turn.observation_ids = delta_ids
        trajectory.append_observation(delta_ids)
        self._check_room()

    def _start_new_sample(self, turn: Turn, context_ids: list[int]) -> None:
        """Close the live sample (it ends on the turn's sampled tokens) and start one from `context_ids`."""
        trajectory = self.trajectory
        if self._room(len(context_ids), self._num_closed_tokens() + self.num_tokens) <= 0:
            # No room to sample after the new context: the episode ends on the live sample as it is.
            self.finish(
                Status.TRUNCATED_TOKENS,
                f"the next context is {len(context_ids)} tokens and leaves no room under {self._budget_names()}",
            )
            return
        trajectory.start_sample(context_ids)
        turn.starts_new_sample = True
        self._check_room()

    def _closed_length(self) -> int:
        """Tokens of the conversation so far, rendered without a generation prompt."""
        return len(self.template.encode(self.template.render(self.messages, self.env.tools, False)))

    def _best_effort_delta(
        self,
        turn: Turn,
        observation: list[Message],
        live_ids: list[int],
        context_ids: list[int],
        rewritten: bool,
    ) -> tuple[list[int], bool]:
        """trajectory_mode=single: tokens to append although the context does not extend the sample,
        and whether the template called them exact (the text extends; only the tokens' split differs)."""
        if not rewritten:  # the template's own text delta, as this mode always appended
            delta = self.template.observation_delta(
                self.messages, turn.completion_ids, observation, self.env.tools
            )
            return delta.token_ids, delta.prefix_ok
        common = 0  # the env rewrote the history: the render beyond the longest common token prefix
        while common < min(len(live_ids), len(context_ids)) and live_ids[common] == context_ids[common]:
            common += 1
        return context_ids[common:], False

    def _too_long(self, history: list[Message]) -> str | None:
        """Why a rewritten history can never fit the live sample (judged by characters alone), or None."""
        limit, num_chars = self.budgets.max_tokens_per_episode, _num_chars(history)
        if num_chars <= limit * CHARS_PER_TOKEN_BOUND:
            return None
        return (
            f"env step returned a history of {num_chars} characters, more than "
            f"rollout.max_tokens_per_episode={limit} tokens can hold"
        )

    def _check_room(self) -> None:
        if not self.done and self.room <= 0:
            self.finish(Status.TRUNCATED_TOKENS, self._budget_names())

    def _budget_names(self) -> str:
        names = f"max_tokens_per_episode={self.budgets.max_tokens_per_episode}"
        if self.budgets.max_total_tokens_per_episode is not None:
            names += f", max_total_tokens_per_episode={self.budgets.max_total_tokens_per_episode}"
        return names

    async def _env_call(self, name: str, check: Callable[[Any], _T], *args: Any, **kwargs: Any) -> _T:
        """Call the env's `name` (reset or step) under the step timeout and validate what it returned."""
        try:
            returned = await call_env(self.env, name, self.budgets.step_timeout_s, *args, **kwargs)
        except EnvCallTimeout as timeout:
            raise EpisodeOver(*timeout_status(timeout)) from None
        except InfraError as exc:
            raise EpisodeOver(Status.SANDBOX_ERROR, f"env {name}: infrastructure failed: {exc}") from None
        except EnvAborted as exc:  # SystemExit, KeyboardInterrupt, ... raised by the env itself
            raise EpisodeOver(Status.ENV_ERROR, f"env {name} raised {exc}") from None
        except Exception as exc:  # noqa: BLE001  # whatever the env raises is this trajectory's env_error
            raise EpisodeOver(Status.ENV_ERROR, f"env {name} raised {type(exc).__name__}: {exc}") from None
        try:
            return check(returned)
        except ValueError as exc:
            raise EpisodeOver(Status.ENV_ERROR, f"env {name} returned a malformed value: {exc}") from None

    def _render(self, render):
        try:
            return render()
        except Exception as exc:  # noqa: BLE001  # the env's messages broke the chat template
            raise EpisodeOver(
                Status.ENV_ERROR, f"chat template failed on the env's messages: {type(exc).__name__}: {exc}"
            ) from None


def timeout_status(timeout: EnvCallTimeout) -> tuple[Status, str]:
    """An env call past step_timeout_s is a time truncation, unless it blocked its event loop (env_error)."""
    name, timeout_s = timeout.method, timeout.timeout_s
    if timeout.blocked_by_this_call:
        return Status.ENV_ERROR, (
            f"env {name} blocked its event loop for more than step_timeout_s={timeout_s} (an async env "
            f"must await, never block): {timeout.blocked_at}"
        )
    blocked = f"; its event loop is blocked by {timeout.blocked_at}" if timeout.blocked_at else ""
    return Status.TRUNCATED_TIME, f"env {name} exceeded step_timeout_s={timeout_s}{blocked}"


def _num_chars(messages: list[Message]) -> int:
    return sum(len(value) for message in messages for value in message.values() if isinstance(value, str))


def _preview(content: str) -> str:
    return f"{content[:PREVIEW_CHARS]}[... {len(content) - PREVIEW_CHARS} more characters not kept]"
