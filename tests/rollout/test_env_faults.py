"""No env value or behaviour kills or hangs a run: each fault ends its own episode with a typed status."""

from __future__ import annotations

import asyncio
import decimal
import fractions
import json
import threading
import time
import warnings

import numpy as np
import pytest

from agentrl.env.base import TextEnv
from agentrl.metrics import dump_trajectories, rollout_metrics
from agentrl.rewards.apply import RewardFunctions
from agentrl.rewards.loading import LoadedFunction
from agentrl.rollout.agent_loop import Budgets, Sampling, run_episode_with_retries
from agentrl.rollout.trajectory import Status, Trajectory
from tests.rollout.misbehaving_envs import HUGE, Misbehaving, SyncMisbehaving
from tests.rollout.scripted import ScriptedEngine

BUDGETS = Budgets(max_turns=2, max_new_tokens_per_turn=8, max_tokens_per_episode=256, step_timeout_s=0.5,
                  episode_timeout_s=30)  # fmt: skip
HANG_GUARD_S = 60  # a hung rollout fails the test instead of the suite


def run_guarded(main):
    """`asyncio.run(main())` on a daemon thread; what it returned, or a failure if it raised or hung."""
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = asyncio.run(main())
        except BaseException as error:  # noqa: BLE001  # SystemExit/KeyboardInterrupt are what is tested
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), f"the rollout did not finish within {HANG_GUARD_S} s"
    assert "error" not in outcome, f"the rollout raised {outcome.get('error')!r}"
    return outcome["value"]


def roll_out(make_envs, tokenizer, template, budgets: Budgets = BUDGETS) -> list[Trajectory]:
    """One episode per env factory, all at once, as the training rollout runs them."""
    return run_guarded(lambda: episodes(make_envs, tokenizer, template, budgets))


async def episodes(make_envs, tokenizer, template, budgets: Budgets = BUDGETS) -> list[Trajectory]:
    engine = ScriptedEngine(tokenizer, ["hi"])
    return await asyncio.gather(*(
        run_episode_with_retries(
            make_env, 0, engine=engine, template=template, row={}, group_id=index, seed=0,
            sampling_seed=0, budgets=budgets, sampling=Sampling(),
        )
        for index, make_env in enumerate(make_envs)
    ))  # fmt: skip


class Replies(TextEnv):
    """Sync: answers every step with `step_return`."""

    def __init__(self, step_return) -> None:
        super().__init__()
        self.step_return = step_return

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "Say something."}], {}

    def step(self, action):
        return self.step_return


# -- values: info, rewards, observations --


def test_numbers_of_any_kind_in_info_reach_metrics_and_the_rollout_record_as_plain_python(
    tokenizer, template, tmp_path
):
    info = {
        "score": np.float32(0.5), "num_calls": np.int64(3), "correct": np.bool_(True), "price": decimal.Decimal("1.25"),
        "share": fractions.Fraction(1, 4), "cost": np.array(2.0), "per_test": {"a": [np.int32(1), np.float16(0.5)]},
    }  # fmt: skip
    (trajectory,) = roll_out(
        [lambda: Replies(([], np.float32(1.0), np.bool_(True), False, info))], tokenizer, template
    )
    assert trajectory.status is Status.COMPLETED and trajectory.reward == 1.0
    assert trajectory.info == {
        "score": 0.5, "num_calls": 3, "correct": True, "price": 1.25, "share": 0.25, "cost": 2.0,
        "per_test": {"a": [1, 0.5]},
    }  # fmt: skip
    assert [type(trajectory.info[key]) for key in ("score", "num_calls", "correct", "cost")] == [
        float,
        int,
        bool,
        float,
    ]
    metrics = rollout_metrics([trajectory])
    assert metrics["env/score/mean"] == 0.5 and metrics["env/num_calls/mean"] == 3.0
    assert (
        metrics["env/price/mean"] == 1.25 and metrics["env/cost/mean"] == 2.0 and metrics["accuracy"] == 1.0
    )
    dump_trajectories(tmp_path / "step_1.jsonl", [trajectory])
    assert json.loads((tmp_path / "step_1.jsonl").read_text())["info"] == trajectory.info


def test_an_info_value_that_is_not_plain_data_is_dropped_with_one_warning_per_key(
    tokenizer, template, tmp_path
):
    step_return = (
        [{"role": "user", "content": "again"}],
        0.0,
        False,
        False,
        {"lock_kept_by_env": threading.Lock(), "n": 1},
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trajectories = roll_out(
            [lambda: Replies(step_return)] * 2, tokenizer, template
        )  # 2 episodes x 2 steps
    assert [t.info for t in trajectories] == [{"n": 1}, {"n": 1}]
    dropped = [str(w.message) for w in caught if "lock_kept_by_env" in str(w.message)]
    assert len(dropped) == 1
    assert dropped[0].startswith("step's info['lock_kept_by_env'] is a _thread.lock, not plain data")
    dump_trajectories(tmp_path / "step_1.jsonl", trajectories)


@pytest.mark.parametrize(("reward", "bound", "shown"), [
    (1.7e308, None, "1.7e+308 is outside rollout.reward_bound=[-1e+06, 1e+06]"),
    (-1.7e308, None, "-1.7e+308 is outside rollout.reward_bound=[-1e+06, 1e+06]"),
    (np.float64(11.0), 10.0, "11.0 is outside rollout.reward_bound=[-10, 10]"),
])  # fmt: skip
def test_a_step_reward_outside_the_bound_is_an_env_error_naming_the_value(
    tokenizer, template, reward, bound, shown
):
    budgets = BUDGETS if bound is None else Budgets(2, 8, 256, 5, 30, reward_bound=bound)
    trajectories = roll_out(
        [lambda: Replies(([], reward, True, False, {})), lambda: Replies(([], 1.0, True, False, {}))],
        tokenizer, template, budgets,
    )  # fmt: skip
    assert [t.status for t in trajectories] == [Status.ENV_ERROR, Status.COMPLETED]
    assert trajectories[0].error == (
        f"env step returned a malformed value: step's reward {shown}; scale the reward down, or raise "
        "rollout.reward_bound"
    )
    assert rollout_metrics(trajectories)["reward/mean"] == 1.0  # group statistics never see the value


def huge(completions, **kwargs):
    return [1.7e308 if completion[0]["content"] == "hi" else 0.5 for completion in completions]


def test_a_reward_function_value_outside_the_bound_is_that_episodes_env_error(tokenizer, template):
    trajectories = roll_out([lambda: Replies(([], 0.0, True, False, {}))] * 2, tokenizer, template)
    trajectories[1].turns[0].action_text = "bye"
    rows = {index: {"prompt": [{"role": "user", "content": "Say something."}]} for index in range(2)}
    functions = RewardFunctions([LoadedFunction("huge", huge, 1.0, "trl")], reward_bound=1e6)
    metrics = functions.apply(trajectories, rows)
    assert [t.status for t in trajectories] == [Status.ENV_ERROR, Status.COMPLETED]
    assert (
        trajectories[0].error
        == "reward function huge returned 1.7e+308, outside rollout.reward_bound=[-1e+06, 1e+06]"
    )
    assert trajectories[1].reward == 0.5 and metrics["reward/huge/mean"] == 0.5


def test_an_observation_too_long_to_tokenize_ends_the_episode_truncated_observation_with_a_small_record(
    tokenizer, template
):
    (trajectory,) = roll_out([lambda: Misbehaving("huge_observation")], tokenizer, template)
    assert trajectory.status is Status.TRUNCATED_OBSERVATION and trajectory.status.is_truncated
    assert trajectory.info["truncation"] == (
        f"env step returned an observation of {HUGE + len('tool')} characters, more than "
        "rollout.max_observation_tokens=8192 tokens can hold"
    )
    assert trajectory.turns[0].observation == [
        {"role": "tool", "content": "x" * 2000 + f"[... {HUGE - 2000} more characters not kept]"}
    ]
    assert trajectory.loss_mask == [1] * len(trajectory.response_ids)  # no observation token entered
    assert len(json.dumps(trajectory.to_json())) < 10_000


def test_an_observation_over_the_token_budget_ends_the_episode_truncated_observation(tokenizer, template):
    budgets = Budgets(2, 8, 256, step_timeout_s=5, episode_timeout_s=30, max_observation_tokens=20)
    observation = [{"role": "user", "content": "word " * 30}]
    short = [{"role": "user", "content": "again"}]
    trajectories = roll_out(
        [lambda: Replies((observation, 0.0, False, False, {})), lambda: Replies((short, 0.0, False, False, {}))],
        tokenizer, template, budgets,
    )  # fmt: skip
    assert [t.status for t in trajectories] == [Status.TRUNCATED_OBSERVATION, Status.TRUNCATED_TURNS]
    message = trajectories[0].info["truncation"]
    assert message.startswith("env step returned an observation of ") and message.endswith(
        " tokens, more than rollout.max_observation_tokens=20"
    )
    assert int(message.split()[6]) > 20
    assert trajectories[0].turns[0].observation == observation and trajectories[0].loss_mask[-1] == 1


def test_a_huge_final_observation_completes_and_keeps_only_its_start(tokenizer, template):
    (trajectory,) = roll_out(
        [lambda: Replies(([{"role": "user", "content": "y" * HUGE}], 1.0, True, False, {}))],
        tokenizer,
        template,
    )
    assert trajectory.status is Status.COMPLETED and trajectory.reward == 1.0
    assert len(json.dumps(trajectory.to_json())) < 10_000


class HugeOpening(Replies):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "z" * HUGE}], {}


def test_opening_messages_too_long_for_the_episode_are_not_tokenized(tokenizer, template):
    (trajectory,) = roll_out([lambda: HugeOpening(None)], tokenizer, template)
    assert trajectory.status is Status.TRUNCATED_TOKENS and trajectory.prompt_ids == []
    assert trajectory.info["truncation"] == (
        f"reset's messages have {HUGE + len('user')} characters, more than 256 tokens can hold (max_tokens_per_episode=256)"
    )


# -- behaviours: SystemExit, KeyboardInterrupt, swallowed cancellation, a blocked event loop --


def exit_while_building() -> TextEnv:
    raise SystemExit(2)


@pytest.mark.parametrize(("make_env", "error"), [
    (lambda: SyncMisbehaving(SystemExit(3)), "env step raised SystemExit: 3"),
    (lambda: SyncMisbehaving(KeyboardInterrupt()), "env step raised KeyboardInterrupt"),
    (lambda: Misbehaving("system_exit"), "env step raised SystemExit: 3"),
    (lambda: Misbehaving("keyboard_interrupt"), "env step raised KeyboardInterrupt"),
    (lambda: Misbehaving("system_exit_in_a_thread"), "env step raised SystemExit: sandbox gave up"),
    (lambda: exit_while_building(), "building the env raised SystemExit: 2"),
])  # fmt: skip
def test_system_exit_and_keyboard_interrupt_from_env_code_end_only_their_episode(
    tokenizer, template, make_env, error
):
    trajectories = roll_out([make_env, lambda: Misbehaving("healthy")], tokenizer, template)
    assert [t.status for t in trajectories] == [Status.ENV_ERROR, Status.COMPLETED]
    assert trajectories[0].error == error


def test_an_async_step_that_swallows_cancellation_is_abandoned_at_the_step_timeout(tokenizer, template):
    trajectories = roll_out(
        [lambda: Misbehaving("swallows_cancellation"), lambda: Misbehaving("healthy")], tokenizer, template
    )
    assert [t.status for t in trajectories] == [Status.TRUNCATED_TIME, Status.COMPLETED]
    assert trajectories[0].info["truncation"] == "env step exceeded step_timeout_s=0.5"


STEPPING = threading.Event()


class StepsSlowly(Misbehaving):
    async def astep(self, action):
        STEPPING.set()
        await asyncio.sleep(0.2)
        return [], 1.0, True, False, {}


class BlocksOnceAnotherEnvSteps(Misbehaving):
    async def astep(self, action):
        while not STEPPING.is_set():
            await asyncio.sleep(0.01)
        time.sleep(600)  # noqa: ASYNC251  # blocks the env loop, on purpose


BLOCKING_LINE = BlocksOnceAnotherEnvSteps.astep.__code__.co_firstlineno + 3


def test_an_async_step_that_blocks_its_event_loop_is_an_env_error_and_later_envs_run_on_a_fresh_loop(
    tokenizer, template
):
    STEPPING.clear()

    async def main():
        first = await episodes([BlocksOnceAnotherEnvSteps, StepsSlowly], tokenizer, template)
        return first, await episodes([lambda: Misbehaving("healthy"), StepsSlowly], tokenizer, template)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (blocked, victim), later = run_guarded(main)
    where = "BlocksOnceAnotherEnvSteps.astep at "
    assert blocked.status is Status.ENV_ERROR
    assert blocked.error.startswith(
        "env step blocked its event loop for more than step_timeout_s=0.5 (an async env must await, never "
        f"block): {where}"
    )
    assert f"test_env_faults.py:{BLOCKING_LINE} (time.sleep(600)  # noqa" in blocked.error
    # The other env on that loop could not finish: a time truncation that names the culprit.
    assert victim.status is Status.TRUNCATED_TIME
    assert victim.info["truncation"].startswith(
        f"env step exceeded step_timeout_s=0.5; its event loop is blocked by {where}"
    )
    (warning,) = [str(w.message) for w in caught if "blocks its event loop" in str(w.message)]
    assert "The loop thread's stack:" in warning and "in astep\n    time.sleep(600)" in warning
    # Envs built afterwards, by the same agent loop, run on a fresh env loop.
    assert [t.status for t in later] == [Status.COMPLETED, Status.COMPLETED]
