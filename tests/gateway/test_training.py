"""`python -m agentrl.train env=agent` as a user runs it: agents written against the SDKs train unmodified."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test trains in a subprocess

TINY = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=4", "rollout.n=4"]


def train(run_dir: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB")}
    result = subprocess.run(
        [sys.executable, "-m", "agentrl.train", *overrides, *TINY, f"trainer.run_dir={run_dir}"],
        check=False, capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result, [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_anthropic_agent_trains_one_step_through_the_gateway(tmp_path):
    _, steps = train(
        tmp_path, "env=agent", "env.kwargs.agent=examples.anthropic_agent:solve",
        "trainer.total_training_steps=1", "data.val_size=4",
    )  # fmt: skip
    assert steps[1]["rollout/status/completed"] == 1.0
    assert steps[1]["env/gateway/num_calls/mean"] >= 1.0
    assert steps[1]["actor/grad_norm"] > 0


def test_training_through_the_gateway_follows_the_tool_envs_held_out_curve(tmp_path):
    settings = ["trainer.total_training_steps=6", "trainer.test_freq=3", "data.val_size=32", "trainer.save_freq=0"]
    held_out = {}
    for env in ("agent", "tool_calling"):
        _, steps = train(tmp_path / env, f"env={env}", *settings)
        held_out[env] = [step["val/reward/mean"] for step in steps if "val/reward/mean" in step]
    # The same tokens and rewards, so the same updates: the curves agree (up to engine batching).
    assert len(held_out["agent"]) == 3
    assert held_out["agent"] == pytest.approx(held_out["tool_calling"], abs=0.05)
