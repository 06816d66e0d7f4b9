"""Smoke runs of `python -m agentrl.train` as a user runs it, with tiny budgets."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.trainer.checkpoint import checkpoint_steps

pytestmark = pytest.mark.slow  # each test trains in a subprocess

REPO = Path(__file__).resolve().parents[2]

TINY = [
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=2",
    "actor.ppo_micro_batch_size_per_gpu=4",
    "rollout.n=4",
    "data.val_size=8",
]


def train(run_dir: Path, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB")}
    return subprocess.run(
        [sys.executable, "-m", "agentrl.train", *overrides, f"trainer.run_dir={run_dir}"],
        check=False, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_main_job_trains_two_steps_and_saves_a_loadable_policy(tmp_path):
    result = train(tmp_path, "env=math", "trainer.total_training_steps=2", *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = metrics(tmp_path)
    assert [record["step"] for record in steps] == [0, 1, 2]
    for key in (
        "reward/mean",
        "frac_reward_zero_std",
        "actor/pg_loss",
        "actor/grad_norm",
        "timing_s/rollout",
        "perf/throughput",
        "rollout/status/completed",
        "response_length/mean",
        "num_turns/mean",
    ):
        assert key in steps[1], key
    assert "val/accuracy" in steps[0] and "val/accuracy" in steps[2]
    trajectory = json.loads((tmp_path / "rollouts" / "step_1.jsonl").read_text().splitlines()[0])
    assert (
        len(trajectory["response_ids"]) == len(trajectory["loss_mask"]) == len(trajectory["rollout_logprobs"])
    )
    assert "held-out accuracy:" in result.stdout
    assert (tmp_path / "wandb").is_dir()  # offline Weights & Biases run, no key needed
    AutoModelForCausalLM.from_pretrained(tmp_path / "hf_model")


def test_the_multi_turn_math_mode_trains_with_feedback_turns_masked(tmp_path):
    result = train(
        tmp_path, "env=math", "env.kwargs.max_attempts=2", "rollout.max_turns=2", "trainer.total_training_steps=1",
        "trainer.logger=[console]", "trainer.val_before_train=false", *TINY,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    trajectories = [
        json.loads(line) for line in (tmp_path / "rollouts" / "step_1.jsonl").read_text().splitlines()
    ]
    retried = [t for t in trajectories if len(t["turns"]) == 2]
    assert retried, "no episode got a second attempt"
    for t in retried:
        first, feedback = t["turns"][0]["completion_ids"], t["turns"][0]["observation_ids"]
        assert t["turns"][0]["observation"] == [
            {"role": "user", "content": "Your answer is incorrect. Try again."}
        ]
        assert t["loss_mask"][: len(first) + len(feedback)] == [1] * len(first) + [0] * len(feedback)


def test_the_custom_env_preset_runs_a_two_step_smoke_training(tmp_path):
    result = train(
        tmp_path, "env=custom", "trainer.total_training_steps=2", "trainer.logger=[console]", *TINY
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [record["step"] for record in metrics(tmp_path)] == [0, 1, 2]


def test_dynamic_sampling_keeps_only_groups_with_reward_spread(tmp_path):
    result = train(
        tmp_path, "env=math", "algorithm.filter_groups.enable=true", "trainer.total_training_steps=1",
        "trainer.logger=[console]", "trainer.val_before_train=false", *TINY,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    trajectories = [
        json.loads(line) for line in (tmp_path / "rollouts" / "step_1.jsonl").read_text().splitlines()
    ]
    rewards_by_group: dict[int, set[float]] = {}
    for t in trajectories:
        rewards_by_group.setdefault(t["group_id"], set()).add(t["reward"])
    (step,) = metrics(tmp_path)
    assert 1 <= len(rewards_by_group) <= 4, "dynamic sampling kept no group"
    assert step["rollout/num_kept_groups"] == len(rewards_by_group)
    assert all(len(rewards) > 1 for rewards in rewards_by_group.values())
    # More rounds only when the first did not fill the batch with informative groups.
    assert 1 <= step["rollout/num_gen_batches"] <= 4
    assert (step["rollout/num_gen_batches"] == 1) == (step["frac_reward_zero_std"] == 0.0)


def test_a_run_whose_env_always_raises_counts_the_errors_and_exits_non_zero_naming_them(tmp_path):
    result = train(
        tmp_path, "env=math", "env.id=tests.train.failing_env:AlwaysFailingEnv", "trainer.total_training_steps=1",
        "trainer.logger=[console]", *TINY,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    last = metrics(tmp_path)[-1]
    assert last["rollout/status/env_error"] == 1.0
    assert last["actor/skipped_update"] == 1.0
    assert "100% of episodes failed (mostly env_error)" in result.stderr
    # Shorter than trainer.max_error_steps, but a run in which no episode completed is no score.
    assert (
        "error: every episode of this run's 1 step failed, mostly env_error; for example: " in result.stderr
    )
    assert "held-out" not in result.stdout


def _wait_for_checkpoint(run_dir: Path, process: subprocess.Popen, step: int, timeout_s: float) -> None:
    latest = run_dir / "checkpoints" / f"step_{step:06d}"
    deadline = time.monotonic() + timeout_s
    while not latest.is_dir():
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.2)


def test_a_run_killed_with_sigkill_resumes_to_the_same_rewards_tokens_and_weights(tmp_path):
    overrides = ["env=math", "trainer.total_training_steps=4", "trainer.save_freq=1", "trainer.logger=[console]",
                 "trainer.val_before_train=false", *TINY]  # fmt: skip
    interrupted, reference = tmp_path / "interrupted", tmp_path / "reference"
    process = subprocess.Popen(
        [sys.executable, "-m", "agentrl.train", *overrides, f"trainer.run_dir={interrupted}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _wait_for_checkpoint(interrupted, process, 2, timeout_s=240)
    process.send_signal(signal.SIGKILL)
    process.wait()

    resumed = train(interrupted, *overrides)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    assert train(reference, *overrides).returncode == 0

    def episodes(run_dir: Path, step: int) -> list[tuple]:
        lines = (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
        return [(t["group_id"], t["reward"], t["response_ids"]) for t in map(json.loads, lines)]

    assert [r["step"] for r in metrics(interrupted)] == [1, 2, 3, 4]  # each step logged once
    for step in range(1, 5):
        assert episodes(interrupted, step) == episodes(reference, step)
    resumed_weights = AutoModelForCausalLM.from_pretrained(interrupted / "hf_model").state_dict()
    reference_weights = AutoModelForCausalLM.from_pretrained(reference / "hf_model").state_dict()
    for name, tensor in reference_weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, rtol=0, atol=1e-6)


def test_ctrl_c_ends_a_run_with_status_130_and_says_which_checkpoint_the_same_command_resumes_from(tmp_path):
    overrides = ["env=math", "trainer.total_training_steps=50", "trainer.save_freq=1", "trainer.logger=[console]",
                 "trainer.val_before_train=false", *TINY, f"trainer.run_dir={tmp_path}"]  # fmt: skip
    # A suite started in the background has SIGINT ignored, and a child would inherit that; a
    # handler (unlike "ignore") is reset to the default when the child starts.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "agentrl.train", *overrides],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    _wait_for_checkpoint(tmp_path, process, 1, timeout_s=240)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-3000:]
    last = checkpoint_steps(tmp_path)[-1]
    assert stderr.endswith(
        f"interrupted; the same command resumes from the checkpoint of step {last} in {tmp_path / 'checkpoints'}\n"
    )
    assert "Traceback" not in stderr


def test_an_unknown_env_id_reads_like_a_config_error(tmp_path):
    result = train(tmp_path, "env=math", "env.id=maht")
    assert result.returncode == 2
    assert result.stderr.startswith("error: unknown env id 'maht'. Did you mean 'math'?")
    result = train(tmp_path, "env=math", "env.kwargs.no_such_knob=1")
    assert result.returncode == 2
    assert "error: env 'math' cannot be built with env.kwargs={'no_such_knob': 1}" in result.stderr


def test_the_custom_env_example_runs_from_any_directory(tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB")}
    result = subprocess.run(
        [sys.executable, "-m", "agentrl.train", "env=custom", "trainer.total_training_steps=1", "trainer.logger=[console]",
         "trainer.val_before_train=false", f"trainer.run_dir={tmp_path / 'run'}", *TINY],
        cwd=tmp_path, check=False, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def _episodes(run_dir: Path, step: int) -> list[tuple]:
    lines = (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
    return [(t["group_id"], t["reward"], t["response_ids"]) for t in map(json.loads, lines)]


def test_two_ranks_under_torchrun_train_what_one_process_trains(tmp_path):
    overrides = ["env=math", "trainer.total_training_steps=2", "trainer.logger=[console]", "trainer.device=cpu",
                 "engine.device=cpu", *TINY]  # fmt: skip
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB")} | {
        "OMP_NUM_THREADS": "1"
    }
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "agentrl.train", *overrides,
         f"trainer.run_dir={tmp_path / 'two'}"],
        check=False, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    assert train(tmp_path / "one", *overrides).returncode == 0
    assert two.stdout.count("step 1/2 (eta ") == 1  # one rank prints and records
    assert [r["step"] for r in metrics(tmp_path / "two")] == [0, 1, 2]
    for step in (1, 2):  # step 2 was sampled by engines that received step 1's update on both ranks
        assert _episodes(tmp_path / "two", step) == _episodes(tmp_path / "one", step)
    two_weights = AutoModelForCausalLM.from_pretrained(tmp_path / "two" / "hf_model").state_dict()
    one_weights = AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "hf_model").state_dict()
    for name, tensor in one_weights.items():
        torch.testing.assert_close(two_weights[name], tensor, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "reward_overrides",
    [
        ["reward.funcs=[examples.trl_reward:correct_answer,examples.trl_reward:short_working]", "reward.weights=[1.0,0.2]"],
        [f"reward.custom_reward_function.path={REPO / 'examples' / 'verl_reward.py'}",
         "reward.custom_reward_function.name=compute_score"],
    ],
    ids=["trl", "verl"],
)  # fmt: skip
def test_trl_and_verl_reward_files_train_unchanged(tmp_path, reward_overrides):
    result = train(
        tmp_path,
        "env=math",
        *reward_overrides,
        "trainer.total_training_steps=2",
        "trainer.logger=[console]",
        *TINY,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    step = metrics(tmp_path)[1]
    names = (
        ["correct_answer", "short_working"]
        if "reward.weights=[1.0,0.2]" in reward_overrides
        else ["compute_score"]
    )
    for name in names:
        assert f"reward/{name}/mean" in step and f"reward/{name}/std" in step
    for trajectory in map(json.loads, (tmp_path / "rollouts" / "step_1.jsonl").read_text().splitlines()):
        assert "env_reward" in trajectory["info"]  # the env's own reward is kept beside the functions'


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_health(url: str, server: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.poll() is None, server.stderr.read()
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, "the served engine never answered /health"
        time.sleep(0.5)


def test_training_against_the_served_engine_over_the_sglang_protocol(tmp_path):
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "agentrl.engine.serve", "--model", "tiny", "--port", str(port), "--device", "cpu"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for_health(f"http://127.0.0.1:{port}", server)
        result = train(
            tmp_path, "env=math", "engine=sglang", f"engine.url=http://127.0.0.1:{port}",
            "trainer.total_training_steps=2", "trainer.logger=[console]", "trainer.device=cpu", *TINY,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert result.returncode == 0, result.stderr[-3000:]
    _, first, second = metrics(tmp_path)
    # Step 2 was sampled from the weights step 1 sent: the served logprobs match the trainer's.
    assert first["actor/grad_norm"] > 0
    assert second["rollout/logprob_diff_max"] < 1e-3
    versions = {
        t["policy_version"]
        for t in map(json.loads, (tmp_path / "rollouts" / "step_2.jsonl").read_text().splitlines())
    }
    assert versions == {1}


def test_a_dead_sandbox_server_gives_retried_then_excluded_sandbox_errors_and_the_run_finishes(tmp_path):
    result = train(
        tmp_path, "env=code_sandbox", "env.kwargs.sandbox_url=http://127.0.0.1:1", "trainer.total_training_steps=2",
        # one attempt: a reply without complete code then ends its episode as completed, never reaching
        # the sandbox; 24 tokens cut the longer functions short, so not every episode of the run fails
        "env.kwargs.max_turns=1", "rollout.max_turns=1", "rollout.max_new_tokens_per_turn=24", "trainer.logger=[console]", "trainer.val_before_train=false", "rollout.max_infra_retries=1",
        "trainer.max_error_frac=0.2", "trainer.max_error_steps=5", "data.train_batch_size=2",
        "actor.ppo_mini_batch_size=2", "rollout.n=2", "data.val_size=2", "rollout.val_kwargs.n=1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    steps = metrics(tmp_path)
    assert [step["step"] for step in steps] == [1, 2]
    num_errors = 0
    for step in steps:
        rollouts = (tmp_path / "rollouts" / f"step_{step['step']}.jsonl").read_text().splitlines()
        trajectories = [json.loads(line) for line in rollouts]
        errors = [t for t in trajectories if t["status"] == "sandbox_error"]
        # An episode whose reply holds no runnable code never reaches the sandbox and completes.
        others = [t for t in trajectories if t["status"] != "sandbox_error"]
        assert all(t["status"] == "completed" and t["num_infra_retries"] == 0 for t in others)
        assert all(t["num_infra_retries"] == 1 for t in errors)  # retried once, then given up
        assert all("Cannot connect to host 127.0.0.1:1" in t["error"] for t in errors)
        assert step["rollout/status/sandbox_error"] == len(errors) / len(trajectories)
        assert step["rollout/infra_retries"] == len(errors)
        # Errors are excluded from the loss: with nothing else the update is skipped.
        assert step.get("actor/skipped_update", 0.0) == (0.0 if others else 1.0)
        if errors:  # 1 in 4 or more: above trainer.max_error_frac=0.2, so the step warns
            share = len(errors) / len(trajectories)
            assert (
                f"step {step['step']}: {share:.0%} of episodes failed (mostly sandbox_error)" in result.stderr
            )
        num_errors += len(errors)
    assert num_errors > 0
