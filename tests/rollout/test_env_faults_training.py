"""A training run whose envs misbehave in every way finishes, exits 0 and counts each typed status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # trains in a subprocess

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_whose_envs_block_swallow_cancellation_exit_and_flood_finishes_and_counts_each_status(tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB")}
    result = subprocess.run(
        [
            sys.executable, "-m", "agentrl.train", "env=math", "env.id=tests.rollout.misbehaving_envs:Cycling",
            "trainer.total_training_steps=1", "trainer.logger=[console]", "trainer.val_before_train=false",
            "data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=4",
            "rollout.n=4", "data.val_size=1", "rollout.step_timeout_s=6", f"trainer.run_dir={tmp_path}",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    step = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert step["step"] == 1 and step["rollout/num_trajectories"] == 16.0
    for status in ("completed", "env_error", "truncated_time", "truncated_observation"):
        assert step[f"rollout/status/{status}"] > 0, status
    assert step["env/num_calls/mean"] > 0 and "accuracy" in step  # numpy values in info reach metrics

    rollouts = tmp_path / "rollouts" / "step_1.jsonl"
    assert rollouts.stat().st_size < 1_000_000  # ten-million-character observations are not kept
    errors = {t["error"] for t in map(json.loads, rollouts.read_text().splitlines()) if t["error"]}
    for expected in (
        "env step raised SystemExit: 3",
        "env step raised KeyboardInterrupt",
        "env step raised SystemExit: sandbox gave up",
        "env step returned a malformed value: step's reward 1.7e+308 is outside rollout.reward_bound",
        "env step blocked its event loop for more than step_timeout_s=6.0",
    ):
        assert any(error.startswith(expected) for error in errors), (expected, errors)
    assert "env code blocks its event loop: Misbehaving.astep, in misbehave at " in result.stderr
