"""Partial rollouts at the rollout stage: an episode spanning a weight update keeps each token's version."""

from __future__ import annotations

import asyncio
import dataclasses

from agentrl.engine import TransformersEngine
from agentrl.engine.config import EngineConfig
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.config import Budgets, Sampling, TrajectoryMode
from agentrl.rollout.episode import Episode
from agentrl.rollout.trajectory import Trajectory
from agentrl.testing.scripted import ScriptedEngine
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from tests.rollout.scripted import GuessEnv

BUDGETS = Budgets(
    max_turns=3, max_new_tokens_per_turn=6, max_tokens_per_episode=512, step_timeout_s=5, episode_timeout_s=20
)


async def play_across_an_update(engine, template: ChatTemplate, budgets: Budgets = BUDGETS) -> Trajectory:
    """Three turns of a guessing episode; the engine is updated to version 1 after the first turn."""
    episode = Episode(
        GuessEnv(attempts=3), engine, template, {"target": "never"},
        group_id=0, seed=1, sampling_seed=2, budgets=budgets, sampling=Sampling(),
    )  # fmt: skip
    await episode.reset()
    await episode.commit(await episode.generate())
    await engine.update_weights({}, version=1)  # a weight update lands while the episode is in flight
    while not episode.done:
        await episode.commit(await episode.generate())
    return episode.trajectory


def test_an_episode_in_flight_at_an_update_samples_its_next_turns_from_the_new_weights(template):
    async def on_the_builtin_engine() -> Trajectory:
        async with TransformersEngine.from_pretrained(
            DEFAULT_MODEL_PATH, EngineConfig(device="cpu")
        ) as engine:
            return await play_across_an_update(engine, template)

    trajectory = asyncio.run(on_the_builtin_engine())

    assert [turn.policy_version for turn in trajectory.turns] == [0, 1, 1]
    first, second, third = (len(turn.completion_ids) for turn in trajectory.turns)
    # Each sampled token carries its own turn's version; observation tokens carry 0 (mask 0).
    assert len(trajectory.token_versions) == len(trajectory.response_ids)
    assert trajectory.sampled_versions() == [0] * first + [1] * (second + third)
    for mask, version in zip(trajectory.loss_mask, trajectory.token_versions, strict=True):
        assert mask or version == 0


def test_every_sample_of_a_segmented_episode_keeps_its_tokens_versions(tokenizer, template):
    budgets = dataclasses.replace(BUDGETS, trajectory_mode=TrajectoryMode.SEGMENTS)
    trajectory = asyncio.run(
        play_across_an_update(ScriptedEngine(tokenizer, ["3", "5", "8"]), template, budgets)
    )

    samples = trajectory.samples()
    assert len(samples) == 3
    assert [s.token_versions for s in samples] == [[0, 0], [1, 1], [1, 1]]  # a digit and end of turn each
    assert trajectory.token_versions_by_sample() == [s.token_versions for s in samples]


def test_per_token_versions_survive_the_json_round_trip(tokenizer, template):
    trajectory = asyncio.run(play_across_an_update(ScriptedEngine(tokenizer, ["3", "5", "8"]), template))

    restored = Trajectory.from_json(trajectory.to_json())

    assert restored == trajectory and restored.sampled_versions() == [0, 0, 1, 1, 1, 1]


def test_a_record_written_before_per_token_versions_loads_with_its_turns_versions(tokenizer, template):
    trajectory = asyncio.run(play_across_an_update(ScriptedEngine(tokenizer, ["3", "5", "8"]), template))
    old_record = trajectory.to_json()
    del old_record["token_versions"]

    restored = Trajectory.from_json(old_record)

    assert restored.token_versions == []
    assert restored.sampled_versions() == [0, 0, 1, 1, 1, 1]
    (versions,) = restored.token_versions_by_sample()  # one sample: the episode only appended
    assert [version for version, mask in zip(versions, restored.loss_mask, strict=True) if mask] == [
        0,
        0,
        1,
        1,
        1,
        1,
    ]
