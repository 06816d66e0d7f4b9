"""`python -m agentrl.train` on a real terminal (a pseudo-terminal): what a person sees."""

from __future__ import annotations

import sys

import pexpect
import pytest


@pytest.mark.slow
def test_a_run_that_loads_the_weights_three_times_shows_one_loading_bar(tmp_path):
    # The engine, the actor and the KL reference each load the policy.
    command = [
        "-m", "agentrl.train", "env=math", "trainer.total_training_steps=1", "trainer.val_before_train=false",
        "actor.use_kl_loss=true", "data.train_batch_size=2", "rollout.n=2", "data.val_size=2",
        "rollout.val_kwargs.n=1", "actor.ppo_mini_batch_size=2", f"trainer.run_dir={tmp_path}",
    ]  # fmt: skip
    child = pexpect.spawn(sys.executable, command, timeout=600, encoding="utf-8", dimensions=(40, 200))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before[-3000:]
    screen = child.before
    assert screen.count("Loading weights: 100%") == 1, screen
    assert "step 1/1 (eta 0s): " in screen
