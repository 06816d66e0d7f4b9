"""`python -m agentrl.eval` as a user runs it, on the bundled tiny policy."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # loads the policy and rolls out in a subprocess


def run_eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentrl.eval", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_eval_command_prints_a_table_and_writes_the_scores(tmp_path):
    output = tmp_path / "scores.json"
    result = run_eval(
        "env=math", "data.val_size=4", "rollout.val_kwargs.n=2", "--k", "1,2", "--output", str(output)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    header = result.stdout.splitlines()[0].split()
    assert header[:6] == ["env", "problems", "n", "pass@1", "pass@2", "pass@turn1"]
    record = json.loads(output.read_text())
    assert (record["model"], record["samples_per_problem"]) == ("tiny", 2)
    scores = record["envs"]["math"]
    assert (scores["num_problems"], scores["num_samples"]) == (4, 2)
    assert set(scores["pass_at_k"]) == {"1", "2"}
    assert 0.0 <= scores["pass_at_k"]["1"] <= scores["pass_at_k"]["2"] <= 1.0


def test_a_k_above_the_samples_per_problem_fails_before_any_work():
    result = run_eval("env=math", "rollout.val_kwargs.n=2", "--k", "4")
    assert result.returncode == 2
    assert "--k 4 needs at least 4 samples per problem, but rollout.val_kwargs.n=2" in result.stderr


def test_a_bad_override_reads_like_a_training_config_error():
    result = run_eval("env=math", "rollout.val_kwarg.n=2")
    assert result.returncode == 2
    assert "unknown config key 'rollout.val_kwarg'" in result.stderr
