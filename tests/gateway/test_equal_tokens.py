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

BUDGETS = Budgets(  # configs/env/tool_calling.yaml's, with room for a cold answer grader
    max_turns=3,
    max_new_tokens_per_turn=64,
    max_tokens_per_episode=400,
    step_timeout_s=120,
    episode_timeout_s=300,
)


async def test_agents_through_the_gateway_train_on_the_tool_envs_tokens_masks_and_rewards(template):
    rows = generate(3, seed=5)
    make_tool_env = functools.partial(
        make, "tool_calling", tools=["calculator"], synthetic_tasks=["arithmetic"]
    )
    rollout = functools.partial(
        rollout_groups, rows, [0, 1, 2], template=template, n=2, seed=0, sampling_seed=11,
        budgets=BUDGETS, sampling=Sampling(),
    )  # fmt: skip
    async with TransformersEngine.from_pretrained(DEFAULT_MODEL_PATH, EngineConfig(device="cpu")) as engine:
        reference = await rollout(make_env=make_tool_env, engine=engine)
        by_agent = {
            agent: await rollout(make_env=functools.partial(make, AGENT_ENV, agent=agent), engine=engine)
            for agent in ("examples.openai_agent:solve", "examples.anthropic_agent:solve")
        }
    assert {t.status.value for t in reference} == {"completed"}
    assert any(len(t.turns) == 2 for t in reference)  # a tool call and its result, then the answer
    for agent, trajectories in by_agent.items():
        for expected, got in zip(reference, trajectories, strict=True):
            assert got.status is expected.status, agent
            assert (got.prompt_ids, got.response_ids, got.loss_mask) == (
                expected.prompt_ids, expected.response_ids, expected.loss_mask
            ), agent  # fmt: skip
            assert got.rollout_logprobs == pytest.approx(expected.rollout_logprobs, abs=1e-5), agent
            assert (got.reward, got.earlier_segments) == (expected.reward, []), agent
