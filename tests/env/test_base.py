import warnings

import pytest
from gymnasium.utils.env_checker import check_env

from agentrl.env import make
from tests.env.scripted_envs import AsyncCountdown, SyncCountdown, Unimplemented


def check_env_strictly(env):
    """gymnasium's checker with its warnings promoted to failures."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


@pytest.mark.parametrize("env_class", [SyncCountdown, AsyncCountdown])
def test_both_sync_only_and_async_only_envs_pass_gymnasiums_env_checker(env_class):
    check_env_strictly(make(f"tests.env.scripted_envs:{env_class.__name__}"))


@pytest.mark.parametrize("env_class", [SyncCountdown, AsyncCountdown])
def test_the_sync_api_plays_a_whole_episode(env_class):
    env = env_class()
    observation, info = env.reset(seed=5)
    number = info["number"]
    assert observation == [{"role": "user", "content": f"say {number}"}]
    assert env.step("wrong") == ([{"role": "user", "content": "again"}], 0.0, False, False, {"remaining": 1})
    assert env.step(str(number)) == ([], 1.0, True, False, {"remaining": 0})
    env.close()
    assert env.closed


@pytest.mark.parametrize("env_class", [SyncCountdown, AsyncCountdown])
async def test_the_async_api_plays_a_whole_episode(env_class):
    env = env_class()
    observation, info = await env.areset(seed=5)
    number = info["number"]
    assert observation == [{"role": "user", "content": f"say {number}"}]
    assert await env.astep("wrong") == (
        [{"role": "user", "content": "again"}],
        0.0,
        False,
        False,
        {"remaining": 1},
    )
    assert await env.astep(str(number)) == ([], 1.0, True, False, {"remaining": 0})
    await env.aclose()
    assert env.closed


async def test_both_apis_give_the_same_task_for_the_same_seed():
    sync_env, async_env = SyncCountdown(), AsyncCountdown()
    assert sync_env.reset(seed=11) == await async_env.areset(seed=11)
    assert sync_env.reset(seed=11) == await sync_env.areset(seed=11)


def test_an_async_only_env_driven_synchronously_keeps_one_event_loop_across_calls():
    env = AsyncCountdown()
    env.reset(seed=0)
    env.step("a")
    env.reset(seed=1)
    assert len(env.loops) == 3
    assert env.loops[0] is env.loops[1] is env.loops[2]
    env.close()
    assert env.loops[0].is_closed()


async def test_an_async_only_env_refuses_sync_calls_from_inside_a_running_event_loop():
    env = AsyncCountdown()
    with pytest.raises(RuntimeError, match="await env.areset"):
        env.reset(seed=0)


async def test_an_env_implementing_neither_api_says_what_to_implement():
    env = Unimplemented()
    with pytest.raises(NotImplementedError, match="implement `areset`"):
        env.reset()
    with pytest.raises(NotImplementedError, match="implement `step`"):
        await env.astep("x")


def test_super_reset_from_a_sync_env_seeds_np_random_like_gymnasium():
    first, second = SyncCountdown(), SyncCountdown()
    first.reset(seed=42)
    second.reset(seed=42)
    assert first.np_random.integers(10**9) == second.np_random.integers(10**9)
