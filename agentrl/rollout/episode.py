"""Rollout stage: one episode stepped turn by turn, token in and token out.

`Episode` is the agent loop's body with the loop taken out, so the training rollout
(`run_episode`) and the interactive debugger drive exactly the same code:

    episode = Episode(env, engine, template, row, group_id=0, seed=1, sampling_seed=2,
                      budgets=budgets, sampling=sampling)
    await episode.reset()
    while not episode.done:
        await episode.commit(await episode.generate())

Model tokens are appended exactly as sampled (loss mask 1, with their rollout logprobs);
observation tokens are the chat template's delta (loss mask 0). Every env return is validated
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
from agentrl.env.validation import check_reset_return, check_step_return
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.config import Budgets, Sampling
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
        return len(self.trajectory.prompt_ids) + len(self.trajectory.response_ids)

    @property
    def room(self) -> int:
        """Tokens the episode budget still allows."""
        return self.budgets.max_tokens_per_episode - self.num_tokens

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
        trajectory.response_ids += generation.completion_ids
        trajectory.loss_mask += [1] * len(generation.completion_ids)
        trajectory.rollout_logprobs += generation.logprobs
        text = self.template.tokenizer.decode(generation.completion_ids, skip_special_tokens=True)
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
        trajectory.info.update(info)
        self.messages.append({"role": "assistant", "content": text})
        if terminated or truncated:
            self.finish(Status.COMPLETED if terminated else Status.TRUNCATED_ENV)
        elif generation.finish_reason is FinishReason.LENGTH and self.room <= 0:
            self.finish(Status.TRUNCATED_TOKENS)
        elif len(trajectory.turns) >= self.budgets.max_turns:
            self.finish(Status.TRUNCATED_TURNS)
        else:
            self._append_observation(turn, observation, too_long)
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
        while trajectory.loss_mask and trajectory.loss_mask[-1] == 0:  # dangling observation tokens
            trajectory.loss_mask.pop()
            trajectory.response_ids.pop()
            trajectory.rollout_logprobs.pop()
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

    def _append_observation(self, turn: Turn, observation: list[Message], too_long: str | None) -> None:
        if too_long is not None:
            self.finish(Status.TRUNCATED_OBSERVATION, too_long)
            return
        try:
            delta = self._render(
                lambda: self.template.observation_delta(
                    self.messages, turn.completion_ids, observation, self.env.tools
                )
            )
        except EpisodeOver as over:
            self.finish(over.status, str(over))
            return
        if len(delta.token_ids) > self.budgets.max_observation_tokens:
            self.finish(
                Status.TRUNCATED_OBSERVATION,
                f"env step returned an observation of {len(delta.token_ids)} tokens, more than "
                f"rollout.max_observation_tokens={self.budgets.max_observation_tokens}",
            )
            return
        self.trajectory.num_template_mismatches += not delta.prefix_ok
        turn.observation_ids = delta.token_ids
        self.messages += observation
        self.trajectory.response_ids += delta.token_ids
        self.trajectory.loss_mask += [0] * len(delta.token_ids)
        self.trajectory.rollout_logprobs += [0.0] * len(delta.token_ids)
        self._check_room()

    def _check_room(self) -> None:
        if not self.done and self.room <= 0:
            self.finish(
                Status.TRUNCATED_TOKENS, f"max_tokens_per_episode={self.budgets.max_tokens_per_episode}"
            )

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
