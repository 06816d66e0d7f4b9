"""Smoke runs of `python -m agentrl.train` with several envs in one run, and with turn-level credit."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test trains in a subprocess


def train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB")}
    return subprocess.run(
        [sys.executable, "-m", "agentrl.train", *overrides, f"trainer.run_dir={run_dir}", "trainer.logger=[console]"],
        check=False, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip


def test_the_mixed_preset_trains_every_env_in_one_step_with_per_env_metrics(tmp_path):
    sizes = [
        f"env.mixture.{name}.data.{key}={value}"
        for name in ("math", "code", "tool")
        for key, value in (("train_size", 8), ("val_size", 2))
    ]
    result = train(
        tmp_path, "env=mixed", "trainer.total_training_steps=1", "data.train_batch_size=3",
        "actor.ppo_mini_batch_size=3", "rollout.n=2", "rollout.val_kwargs.n=1", *sizes,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    step = records[-1]
    for name in ("math", "code", "tool"):
        assert f"reward/{name}/mean" in step and f"val/{name}/accuracy" in step, name
    assert step["val/num_problems"] == 6.0
    trajectories = [
        json.loads(line) for line in (tmp_path / "rollouts" / "step_1.jsonl").read_text().splitlines()
    ]
    assert len(trajectories) == 6  # one row (group of 2) of each env


def test_turn_level_credit_trains_a_multi_turn_env(tmp_path):
    result = train(
        tmp_path, "env=multiturn", "algorithm.adv_granularity=turn", "algorithm.turn_discount=0.9",
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=4", "rollout.n=4", "data.val_size=4",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    step = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert "actor/pg_loss" in step and step.get("actor/skipped_update", 0.0) == 0.0
