"""Environment stage: env=agent, an episode is one run of an agent program against the gateway.

`AgentEnv(agent="package.module:function")` runs `function(base_url, api_key, task)` once per
episode, sync or async, where `base_url` is the episode's gateway session (OpenAI clients use
`base_url + "/v1"`, Anthropic clients `base_url`) and `task` the dataset row. With
`subprocess=True` the function runs in a child process instead
(`python -m agentrl.gateway.agent_process`), with OPENAI_BASE_URL, OPENAI_API_KEY,
ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY set and the row on its stdin.

The env drives its own episode (`drive_episode`; the rollout asks every env whether it does): it
opens a session on the event loop's shared gateway, runs the agent within the episode timeout and
turns the session into a trajectory. The reward is the agent's return value, else what it posted
to `/s/{session}/reward`; with `reward_from_functions=True` an episode without one is left to the
configured reward functions, which score its messages. Failures are typed: an agent that raises
or gives no reward is agent_error, one past episode_timeout_s truncated_time, one whose calls the
engine failed engine_error (retried); a budget that refuses a call truncates the episode with
the budget's status, whatever the agent does next.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.engine.protocol import InferenceEngine
from agentrl.env.base import TextEnv
from agentrl.env.registry import load_object
from agentrl.env.threads import run_in_daemon_thread
from agentrl.gateway.agent_process import run_agent_process
from agentrl.gateway.server import Gateway
from agentrl.gateway.sessions import Session
from agentrl.gateway.turn_format import TurnFormat
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.config import Budgets, Sampling
from agentrl.rollout.trajectory import Status, Trajectory

SESSION_GRACE_S = 30.0  # a session outlives its episode's timeout by this much, then expires


class AgentEnv(TextEnv):
    """Each episode runs `agent` against a gateway session; the session's tokens are trained.

    Args:
        agent: "package.module:function", called as function(base_url, api_key, task) -> reward | None.
        subprocess: run it in a child process with the client environment variables set.
        reward_from_functions: an episode whose agent gives no reward is scored by the configured
            reward functions (reward.functions) instead of being an agent_error.
        max_concurrent_calls: model calls the gateway serves at once, over all episodes.
    """

    def __init__(
        self,
        agent: str,
        subprocess: bool = False,
        reward_from_functions: bool = False,
        max_concurrent_calls: int = 64,
    ) -> None:
        super().__init__()
        function = load_object(agent)
        if not callable(function):
            raise ValueError(  # noqa: TRY004  # user input: ValueError project-wide
                f"env.kwargs.agent={agent!r} is not callable; name a function (base_url, api_key, task)"
            )
        if max_concurrent_calls < 1:
            raise ValueError(f"max_concurrent_calls must be >= 1, got {max_concurrent_calls}")
        self.agent, self.function, self.subprocess = agent, function, subprocess
        self.reward_from_functions = reward_from_functions
        self.max_concurrent_calls = max_concurrent_calls

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        raise NotImplementedError(
            "env=agent drives its own episode: the rollout calls AgentEnv.drive_episode, not reset/step"
        )

    async def drive_episode(
        self,
        engine: InferenceEngine,
        template: ChatTemplate,
        row: dict[str, Any],
        *,
        group_id: int,
        seed: int,
        sampling_seed: int,
        budgets: Budgets,
        sampling: Sampling,
    ) -> Trajectory:
        """Run the agent on `row` against a fresh session; the session's trajectory, never raising."""
        gateway = await shared_gateway(engine, template, self.max_concurrent_calls)
        session = gateway.open_session(
            budgets, group_id=group_id, sampling_seed=sampling_seed, sampling=sampling,
            ttl_s=budgets.episode_timeout_s + SESSION_GRACE_S,
        )  # fmt: skip
        returned: Any = None
        failure: str | None = None
        timed_out = False
        try:
            returned = await asyncio.wait_for(
                self._run(gateway.base_url(session), gateway.api_key, row), budgets.episode_timeout_s
            )
        except TimeoutError:
            timed_out = True
        except Exception as exc:  # noqa: BLE001  # whatever the agent raises is this episode's agent_error
            failure = f"the agent raised {type(exc).__name__}: {exc}"
        finally:
            gateway.close_session(session.id)
            if timed_out:
                session.end(
                    Status.TRUNCATED_TIME, f"the agent ran past episode_timeout_s={budgets.episode_timeout_s}"
                )
            async with session.lock:  # a call in flight finishes recording first
                session.end(Status.COMPLETED, "the agent finished")  # later calls are refused
        return episode_trajectory(session, returned, failure, budgets, self.reward_from_functions)

    async def _run(self, base_url: str, api_key: str, row: dict[str, Any]) -> Any:
        if self.subprocess:
            return await run_agent_process(self.agent, base_url, api_key, row)
        # A daemon thread with its own loop: an agent that blocks cannot stall the rollout, and
        # one past the episode timeout is abandoned (its session is closed, so it can do no harm).
        return await run_in_daemon_thread(_call, self.function, base_url, api_key, row)


def _call(function: Callable[..., Any], base_url: str, api_key: str, row: dict[str, Any]) -> Any:
    result = function(base_url, api_key, row)
    if inspect.isawaitable(result):
        return asyncio.run(_wait(result))
    return result


async def _wait(awaitable: Any) -> Any:
    return await awaitable


def episode_trajectory(
    session: Session, returned: Any, failure: str | None, budgets: Budgets, reward_from_functions: bool
) -> Trajectory:
    """The session's trajectory with its status and reward decided (see the module docstring)."""
    trajectory = session.trajectory
    ending = session.ending
    budget_ended = ending is not None and ending.status not in (Status.COMPLETED,)
    status, reward, error = Status.COMPLETED, None, None
    if ending is not None and ending.status is Status.ENGINE_ERROR:  # not the agent's doing: retried
        status, error = ending.status, ending.message
    elif not session.record.calls:
        status, error = Status.AGENT_ERROR, failure or "the agent never called the model at its base_url"
        if ending is not None and ending.status is Status.TRUNCATED_TIME:
            error = f"the agent called no model before episode_timeout_s={budgets.episode_timeout_s}"
    elif budget_ended and ending.status is Status.TRUNCATED_TIME:
        status, error = ending.status, ending.message
    elif failure is not None and not budget_ended:
        status, error = Status.AGENT_ERROR, failure
    else:
        if budget_ended:
            status = ending.status
            trajectory.info["truncation"] = ending.message
        reward = session.reward if returned is None else returned
        if reward is None and not reward_from_functions and not budget_ended:
            status, error = (
                Status.AGENT_ERROR,
                (
                    "the agent gave no reward: return one, POST it to <base_url>/reward, or set "
                    "env.kwargs.reward_from_functions=true with reward.functions"
                ),
            )
        elif reward is not None and not _is_reward(reward, budgets.reward_bound):
            status, error = (
                Status.AGENT_ERROR,
                (
                    f"the agent's reward {reward!r} is not a finite number within "
                    f"rollout.reward_bound={budgets.reward_bound:g}"
                ),
            )
            reward = None
    trajectory.status = status
    if error is not None:
        trajectory.error = error if status.is_error else None
        if not status.is_error:
            trajectory.info["truncation"] = error
    trajectory.reward = float(reward) if reward is not None and not status.is_error else 0.0
    if trajectory.turns:
        trajectory.turns[-1].reward = trajectory.reward
    calls = session.record.calls
    trajectory.info["gateway/num_calls"] = len(calls)
    trajectory.info["gateway/num_samples"] = len(trajectory.earlier_segments) + bool(calls)
    trajectory.info["gateway/num_altered_turns"] = sum(len(call.altered_turns) for call in calls)
    trajectory.info["gateway/new_samples"] = [call.why_new_sample for call in calls[1:] if not call.joined]
    return trajectory


def _is_reward(value: Any, bound: float) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) <= bound
    )


# -- one gateway per event loop and engine, started at the first episode, closed with the loop --

_Key = tuple[int, int]  # the engine's and the template's ids


@dataclass
class _LoopGateways:
    """The gateways of one event loop, and the task that closes them when the loop shuts down."""

    started: dict[_Key, asyncio.Task[Gateway]] = field(default_factory=dict)
    closer: asyncio.Task | None = None  # held here: a task the loop alone refers to may be collected


_gateways: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopGateways] = weakref.WeakKeyDictionary()


async def shared_gateway(
    engine: InferenceEngine, template: ChatTemplate, max_concurrent_calls: int
) -> Gateway:
    """The running loop's gateway in front of `engine` and the run's renderer, started on first use."""
    loop = asyncio.get_running_loop()
    gateways = _gateways.get(loop)
    if gateways is None:
        gateways = _gateways[loop] = _LoopGateways()
        gateways.closer = loop.create_task(_close_with_loop(gateways), name="gateway-closer")
    key = (id(engine), id(template))
    if key not in gateways.started:  # a task, so episodes that start together share one start
        gateway = Gateway(engine, TurnFormat(template), max_concurrent_calls=max_concurrent_calls)
        gateways.started[key] = loop.create_task(gateway.start(), name="gateway-start")
    return await asyncio.shield(gateways.started[key])


async def _close_with_loop(gateways: _LoopGateways) -> None:
    """Wait until cancelled (the loop shuts down), then close the loop's gateways."""
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        tasks = gateways.started.values()
        started = [
            task.result() for task in tasks if task.done() and not task.cancelled() and not task.exception()
        ]
        await asyncio.gather(*(gateway.close() for gateway in started))
