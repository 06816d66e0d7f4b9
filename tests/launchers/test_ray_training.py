"""`python -m agentrl.train trainer.launcher=ray` trains what one process trains, in both placements."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.train import main

pytestmark = pytest.mark.slow  # each test starts Ray actors that train

TINY_RUN = [
    "env=math", "trainer.total_training_steps=2", "trainer.logger=[console]", "trainer.device=cpu",
    "engine.device=cpu", "data.train_batch_size=4", "actor.ppo_mini_batch_size=2",
    "actor.ppo_micro_batch_size_per_gpu=4", "rollout.n=4", "data.val_size=8",
]  # fmt: skip


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("one_process")
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB")}
    result = subprocess.run(
        [sys.executable, "-m", "agentrl.train", *TINY_RUN, f"trainer.run_dir={run_dir}"],
        check=False, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def episodes(run_dir: Path, step: int) -> list[tuple]:
    lines = (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
    return [(t["group_id"], t["reward"], t["response_ids"]) for t in map(json.loads, lines)]


@pytest.mark.parametrize(
    "placement",
    [
        ["ray.placement=colocated"],
        # Default sizes: two workers and one engine actor share the instance's two CPUs out.
        ["ray.placement=split"],
    ],
    ids=["colocated", "split"],
)
def test_two_ray_policy_workers_train_what_one_process_trains(
    ray_instance, one_process_run, tmp_path, placement
):
    assert main([*TINY_RUN, "trainer.launcher=ray", *placement, f"trainer.run_dir={tmp_path}"]) == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [0, 1, 2]  # rank 0 alone writes
    for step in (1, 2):  # step 2 was sampled from the weights step 1 sent to every engine
        assert episodes(tmp_path, step) == episodes(one_process_run, step)
    ray_weights = AutoModelForCausalLM.from_pretrained(tmp_path / "hf_model").state_dict()
    one_weights = AutoModelForCausalLM.from_pretrained(one_process_run / "hf_model").state_dict()
    for name, tensor in one_weights.items():
        torch.testing.assert_close(ray_weights[name], tensor, rtol=0, atol=1e-5)
    assert not (tmp_path / "weight_sync").exists()  # the split run's weight exports are removed


def test_a_cluster_too_small_for_the_workers_fails_at_once_with_what_was_asked(
    ray_instance, tmp_path, capsys
):
    # No ray.startup_timeout_s here: the default 300 s wait is not taken, the cluster cannot hold them.
    overrides = ["trainer.launcher=ray", "ray.num_workers=3", "ray.num_cpus_per_worker=1"]
    assert main([*TINY_RUN, *overrides, f"trainer.run_dir={tmp_path}"]) == 2
    error = capsys.readouterr().err
    assert "cannot hold 3 policy workers of {'CPU': 1.0}" in error
    assert "it has 2 CPU" in error
    assert "Lower ray.num_workers" in error


def test_a_user_error_inside_a_worker_reads_as_it_does_in_one_process(ray_instance, tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    assert (
        main(
            [
                *TINY_RUN,
                "trainer.launcher=ray",
                "data.generator=null",
                f"data.train_files=[{missing}]",
                f"trainer.run_dir={tmp_path}",
            ]
        )
        == 2
    )
    assert str(missing) in capsys.readouterr().err
