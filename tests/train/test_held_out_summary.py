"""The run's last line: held-out results as measured, never a score where no episode completed."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.train import held_out_summary


def write_metrics(path: Path, *records: dict) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def evaluation(step: int, accuracy: float, error_frac: float, **statuses: float) -> dict:
    return {
        "step": step, "val/reward/mean": accuracy, "val/accuracy": accuracy, "val/accuracy_stderr": 0.1,
        "val/num_problems": 4.0, "val/rollout/error_frac": error_frac,
        **{f"val/rollout/status/{status}": share for status, share in statuses.items()},
    }  # fmt: skip


def test_an_evaluation_whose_every_episode_failed_is_named_as_such_not_scored_zero(tmp_path):
    path = write_metrics(
        tmp_path / "metrics.jsonl",
        evaluation(0, 0.25, 0.0, completed=1.0, env_error=0.0),
        evaluation(2, 0.0, 1.0, completed=0.0, env_error=0.75, sandbox_error=0.25),
    )
    assert held_out_summary(path) == (
        "held-out accuracy: 0.250 ± 0.100 at step 0 -> no episode completed (mostly env_error) at step 2 "
        "(4 problems; ± one standard error)"
    )


def test_a_single_evaluation_that_failed_whole_says_which_status(tmp_path):
    path = write_metrics(
        tmp_path / "metrics.jsonl", evaluation(0, 0.0, 1.0, completed=0.0, sandbox_error=1.0)
    )
    assert (
        held_out_summary(path)
        == "held-out accuracy: no episode completed (all sandbox_error) at step 0 (4 problems)"
    )


def test_an_evaluation_with_some_failures_is_still_scored(tmp_path):
    path = write_metrics(tmp_path / "metrics.jsonl", evaluation(0, 0.5, 0.5, completed=0.5, env_error=0.5))
    assert held_out_summary(path) == "held-out accuracy: 0.500 ± 0.100 at step 0 (4 problems)"


def test_a_reward_only_env_reports_its_reward_with_the_standard_error_over_problems(tmp_path):
    reward_only = [
        {"step": step, "val/reward/mean": mean, "val/reward/mean_stderr": 0.05, "val/num_problems": 90.0}
        for step, mean in ((0, 0.339), (12, 0.289))
    ]
    assert held_out_summary(write_metrics(tmp_path / "metrics.jsonl", *reward_only)) == (
        "held-out reward/mean: 0.339 ± 0.050 at step 0 -> 0.289 ± 0.050 at step 12 (90 problems; ± one standard error)"
    )
