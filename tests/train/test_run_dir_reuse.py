"""A command never overwrites the records of a run already in its run dir unless it continues that run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.train import main

SMALL = ["env=math", "trainer.logger=[console]", "data.val_size=4", "rollout.val_kwargs.n=1"]


def a_finished_run(run_dir: Path) -> bytes:
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("kept: true\n")
    lines = "".join(json.dumps({"step": step, "reward/mean": 0.5}) + "\n" for step in (0, 1, 2))
    (run_dir / "metrics.jsonl").write_text(lines)
    return lines.encode()


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["trainer.total_training_steps=0"], "an evaluation-only run (trainer.total_training_steps=0) would overwrite it"),
        (["trainer.resume=disable"], "trainer.resume=disable would start it over"),
    ],
    ids=["evaluation-only", "resume-disabled"],
)  # fmt: skip
def test_a_command_that_would_start_a_held_run_over_is_refused_and_leaves_its_records(
    tmp_path, capsys, overrides, reason
):
    run_dir = tmp_path / "run"
    metrics = a_finished_run(run_dir)
    assert main([*SMALL, *overrides, f"trainer.run_dir={run_dir}"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: run dir {run_dir} holds a run (metrics up to step 2, no checkpoint); ")
    assert f"{reason}; use a new trainer.experiment_name" in line
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics
    assert (run_dir / "config.yaml").read_text() == "kept: true\n"


def test_an_evaluation_only_run_into_a_new_run_dir_evaluates(tmp_path, capsys):
    run_dir = tmp_path / "eval"
    assert main([*SMALL, "trainer.total_training_steps=0", f"trainer.run_dir={run_dir}"]) == 0
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0]
