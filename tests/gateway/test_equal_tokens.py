"""The same tasks, template and sampling seeds through the gateway and through env=tool_calling:
the agents written against the openai and anthropic clients train on exactly the same tokens."""

from __future__ import annotations

import functools

import pytest

from agentrl.engine.builtin.engine import TransformersEngine
from agentrl.engine.config import EngineConfig
from agentrl.env.registry import make
from agentrl.rollout.config import Budgets, Sampling
from agentrl.rollout.groups import rollout_groups
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from envs.tool_calling.synthetic import generate
from tests.gateway.conftest import AGENT_ENV

TASKS = ["arithmetic", "country", "population"]  # one row of each, as configs/env/tool_calling.yaml's
BUDGETS = Budgets(  # configs/env/tool_calling.yaml's, with room for a cold answer grader
    max_turns=4,
    max_new_tokens_per_turn=64,
    max_tokens_per_episode=1000,
    step_timeout_s=120,
    episode_timeout_s=300,
)


async def test_agents_through_the_gateway_train_on_the_tool_envs_tokens_masks_and_rewards(template):
    rows = generate(3, seed=5, tasks=TASKS)
    make_tool_env = functools.partial(
        make, "tool_calling", tools=["calculator", "search"], synthetic_tasks=TASKS
    )
    rollout = functools.partial(
        rollout_groups, rows, [0, 1, 2], template=template, n=1, seed=0, sampling_seed=2,
        budgets=BUDGETS, sampling=Sampling(),
    )  # fmt: skip
    async with TransformersEngine.from_pretrained(DEFAULT_MODEL_PATH, EngineConfig(device="cpu")) as engine:
        reference = await rollout(make_env=make_tool_env, engine=engine)
        by_agent = {
            agent: await rollout(make_env=functools.partial(make, AGENT_ENV, agent=agent), engine=engine)
            for agent in ("examples.openai_agent:solve", "examples.anthropic_agent:solve")
        }
    assert {t.status.value for t in reference} == {"completed"}
    # Seeds where every call is well formed (the gateway answers a malformed one differently, see
    # docs/gateway.md): a calculator call, then two and three lookups, a turn each; the country
    # (a name, graded by exact match) and the population answered right.
    assert [(t.info["calls_calculator"], t.info["calls_search"], len(t.turns)) for t in reference] == [
        (1, 0, 2),
        (0, 2, 3),
        (0, 3, 4),
    ]
    assert [t.reward for t in reference] == [0.0, 1.0, 1.0]
    for agent, trajectories in by_agent.items():
        for expected, got in zip(reference, trajectories, strict=True):
            assert got.status is expected.status, agent
            assert (got.prompt_ids, got.response_ids, got.loss_mask) == (
                expected.prompt_ids, expected.response_ids, expected.loss_mask
            ), agent  # fmt: skip
            assert got.rollout_logprobs == pytest.approx(expected.rollout_logprobs, abs=1e-5), agent
            assert (got.reward, got.earlier_segments) == (expected.reward, []), agent
