"""The multi-turn example env (examples/multiturn_env.py) trained by `python -m agentrl.train`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from examples.multiturn_env import FEEDBACK
from tests.train.test_entry_points import metrics, train

pytestmark = pytest.mark.slow  # trains in a subprocess

NUM_STEPS = 10


def rollouts(run_dir: Path, step: int) -> list[dict]:
    return [
        json.loads(line) for line in (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
    ]


def test_the_multi_turn_example_trains_on_its_retries_and_learns(tmp_path):
    result = train(
        tmp_path, "env=multiturn", f"trainer.total_training_steps={NUM_STEPS}", "trainer.test_freq=0",
        "trainer.save_freq=0", "trainer.logger=[console]",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    steps = metrics(tmp_path)
    assert [step["step"] for step in steps] == list(range(NUM_STEPS + 1))
    before, after = steps[0], steps[-1]
    for evaluation in (before, after):
        # One turn per attempt: the turn count the loop measures is the attempt count the env reports.
        assert evaluation["val/num_turns/mean"] == evaluation["val/env/num_attempts/mean"]
        assert evaluation["val/env/first_attempt_correct/mean"] <= evaluation["val/accuracy"]
        assert "val/accuracy_stderr" in evaluation

    num_retried = 0
    for step in steps[1:]:
        assert step["rollout/status/completed"] == 1.0  # the env ends every episode within max_turns
        assert step["num_turns/mean"] == step["env/num_attempts/mean"]
        if step["frac_reward_zero_std"] < 1.0:  # some group has reward spread, so a gradient
            assert step["actor/grad_norm"] > 0, step["step"]
        for trajectory in rollouts(tmp_path, step["step"]):
            turns = trajectory["turns"]
            assert trajectory["reward"] == sum(turn["reward"] for turn in turns)  # the episode's reward
            assert trajectory["info"]["num_attempts"] == len(turns)
            assert trajectory["info"]["correct"] == (trajectory["reward"] > 0)
            if len(turns) == 1:  # right at once
                assert trajectory["reward"] == 1.0
                continue
            num_retried += 1
            first, second = turns
            assert first["reward"] == 0.0 and second["reward"] in (0.0, 0.5)
            assert first["observation"] == [{"role": "user", "content": FEEDBACK}]
            completion, feedback = first["completion_ids"], first["observation_ids"]
            if first["starts_new_sample"]:
                # The sampled tokens were not the tokenizer's own split of their text, so the next
                # render does not extend them: the retry is a sample of its own (trajectory_mode=auto).
                [earlier] = trajectory["earlier_segments"]
                assert earlier["response_ids"] == completion and earlier["loss_mask"] == [1] * len(completion)
                assert trajectory["response_ids"] == second["completion_ids"]
                assert trajectory["loss_mask"] == [1] * len(second["completion_ids"])
                continue
            assert trajectory["response_ids"] == completion + feedback + second["completion_ids"]
            assert trajectory["loss_mask"] == [1] * len(completion) + [0] * len(feedback) + [1] * len(
                second["completion_ids"]
            )
    assert num_retried > 0, "no episode got a second attempt"

    # Measured on 2 CPU cores with trainer.seed=0, 1, 2, 3: +0.12, +0.08, +0.09, +0.06 (stderr about 0.03).
    assert after["val/accuracy"] > before["val/accuracy"]
    assert "held-out accuracy:" in result.stdout
