"""Short runs of the multi-turn presets as a user runs them: the code env's second attempts and the
tool env's multi-lookup episodes are trained on, with the model's tokens in the loss and the env's
feedback out of it; a trained code policy fixes first attempts on the eval."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.rollout.trajectory import Trajectory

pytestmark = pytest.mark.slow  # each test trains (and evaluates) in a subprocess

SHORT = [
    "trainer.total_training_steps=2",
    "data.train_batch_size=4",
    "rollout.n=4",
    "actor.ppo_mini_batch_size=2",
    "actor.ppo_micro_batch_size_per_gpu=8",
    "trainer.val_before_train=false",
    "rollout.val_kwargs.n=1",
    "trainer.logger=[console]",
]


def run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB")}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        check=False, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def trained_episodes(run_dir: Path) -> list[Trajectory]:
    """The episodes of every training step (not the held-out evaluation's)."""
    return [
        Trajectory.from_json(json.loads(line))
        for path in sorted((run_dir / "rollouts").glob("step_*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def assert_model_tokens_in_the_loss_and_feedback_out(episodes: list[Trajectory]) -> None:
    """Every sampled token is trained on and nothing else. An episode whose next context extends
    what was sampled is one sample, with mask 1 on each reply and 0 on the env's answer between
    replies; one whose reply did not round-trip through the template trains as several samples."""
    single_sample = 0
    for episode in episodes:
        num_masked_in = sum(sum(sample.loss_mask) for sample in episode.samples())
        assert num_masked_in == sum(len(turn.completion_ids) for turn in episode.turns)
        if episode.earlier_segments:
            continue
        single_sample += 1
        assert all(turn.observation_ids for turn in episode.turns[:-1]), "the env's answer is missing"
        expected_mask = []
        for turn in episode.turns:
            expected_mask += [1] * len(turn.completion_ids) + [0] * len(turn.observation_ids)
        # the answer to the last turn, if any, ends the episode and is not part of the sample
        assert episode.loss_mask == expected_mask[: len(episode.loss_mask)]
        assert len(episode.loss_mask) >= len(expected_mask) - len(episode.turns[-1].observation_ids)
    assert single_sample, "every episode was split into samples"


def test_code_second_attempts_are_trained_on_and_fix_first_attempts(tmp_path):
    run_dir = tmp_path / "run"
    result = run_module(
        "agentrl.train", "env=code_sandbox", *SHORT, "data.val_size=4", f"trainer.run_dir={run_dir}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    retried = [episode for episode in trained_episodes(run_dir) if len(episode.turns) == 2]
    assert retried, "no trained episode took a second attempt"
    assert_model_tokens_in_the_loss_and_feedback_out(retried)

    scores_path = tmp_path / "eval.json"
    result = run_module(
        "agentrl.eval", "env=code_sandbox", f"model.path={run_dir / 'hf_model'}", "data.val_size=16",
        "rollout.val_kwargs.n=4", "--output", str(scores_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    scores = json.loads(scores_path.read_text())["envs"]["code_sandbox"]
    # pass@turn is cumulative, so only a strict gain says that second attempts fixed something.
    assert scores["pass_at_turn"]["2"] > scores["pass_at_turn"]["1"], scores
    assert scores["fix_rate"] > 0.0


def test_search_episodes_with_several_lookups_are_trained_on(tmp_path):
    run_dir = tmp_path / "run"
    multi_hop = "[country,population]"
    result = run_module(
        "agentrl.train", "env=tool_calling", *SHORT, "data.val_size=4",
        f"data.generator_kwargs.tasks={multi_hop}", f"env.kwargs.synthetic_tasks={multi_hop}",
        f"trainer.run_dir={run_dir}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    episodes = trained_episodes(run_dir)
    multi_lookup = [episode for episode in episodes if episode.info.get("calls_search", 0) >= 2]
    assert multi_lookup, f"no trained episode searched twice among {len(episodes)}"
    assert all(len(episode.turns) >= 2 for episode in multi_lookup)
    assert_model_tokens_in_the_loss_and_feedback_out(multi_lookup)
