import random

import pytest
import torch

from agentrl.trainer.actor_config import ActorConfig
from agentrl.trainer.batch import build_train_batch
from agentrl.trainer.checkpoint import checkpoint_steps, load_latest_checkpoint, save_checkpoint
from agentrl.trainer.policy_worker import PolicyWorker
from tests.trainer.tiny_model import PAD_TOKEN_ID, short_trajectory, two_turn_trajectory

CONFIG = ActorConfig(
    ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2, optim={"lr": 1e-2, "warmup_steps": 4}
)


def trained_worker(model_dir) -> PolicyWorker:
    worker = PolicyWorker(model_dir, CONFIG)
    trajectories = [two_turn_trajectory(0), short_trajectory(0, [4, 9]), short_trajectory(1, [5, 6])]
    batch = build_train_batch(trajectories, torch.tensor([1.0, -1.0, 0.5]), PAD_TOKEN_ID)
    batch.old_logprobs, _ = worker.compute_logprobs(batch)
    worker.update(batch)
    return worker


def optimizer_tensors(worker: PolicyWorker) -> dict[str, torch.Tensor]:
    state = worker.optimizer.state_dict()["state"]
    return {
        f"{index}.{key}": value.full_tensor() if hasattr(value, "full_tensor") else value
        for index, entry in state.items()
        for key, value in entry.items()
    }


def test_load_restores_weights_optimizer_scheduler_rng_and_trainer_state(tiny_model_dir, tmp_path):
    worker = trained_worker(tiny_model_dir)
    save_checkpoint(tmp_path, 7, worker, {"step": 7, "data_cursor": 42})
    expected_draws = (random.random(), torch.rand(3))
    # a save killed mid-write leaves a .tmp directory with a partial checkpoint
    partial = tmp_path / "checkpoints" / "step_000008.tmp"
    (partial / "state").mkdir(parents=True)
    (partial / "trainer_state.json").write_text('{"step": 8')

    fresh = PolicyWorker(tiny_model_dir, CONFIG)
    assert load_latest_checkpoint(tmp_path, fresh) == (7, {"step": 7, "data_cursor": 42})
    saved_weights, loaded_weights = worker.full_state_dict(), fresh.full_state_dict()
    assert all(torch.equal(saved_weights[name], loaded_weights[name]) for name in saved_weights)
    saved_moments, loaded_moments = optimizer_tensors(worker), optimizer_tensors(fresh)
    assert set(saved_moments) == set(loaded_moments) and len(saved_moments) > 0
    assert all(torch.equal(saved_moments[key], loaded_moments[key]) for key in saved_moments)
    assert fresh.scheduler.get_last_lr() == worker.scheduler.get_last_lr() == [pytest.approx(0.5e-2)]
    assert (random.random(), torch.rand(3).tolist()) == (expected_draws[0], expected_draws[1].tolist())


def test_a_checkpoint_of_an_unfused_adamw_resumes_fused_and_still_skips_a_non_finite_step(
    tiny_model_dir, tmp_path
):
    """Checkpoints written before AdamW was fused on CPU carry fused=False in their param groups."""
    worker = trained_worker(tiny_model_dir)
    for group in worker.optimizer.param_groups:
        group["fused"] = False
    save_checkpoint(tmp_path, 3, worker, {"step": 3})

    fresh = PolicyWorker(tiny_model_dir, CONFIG)
    load_latest_checkpoint(tmp_path, fresh)
    assert [group["fused"] for group in fresh.optimizer.param_groups] == [True]
    saved_moments, loaded_moments = optimizer_tensors(worker), optimizer_tensors(fresh)
    assert all(torch.equal(saved_moments[key], loaded_moments[key]) for key in saved_moments)  # state loads
    weights = fresh.full_state_dict()
    trajectories = [two_turn_trajectory(0), short_trajectory(0, [4, 9])]
    batch = build_train_batch(trajectories, torch.tensor([float("nan"), 1.0]), PAD_TOKEN_ID)
    batch.old_logprobs, _ = fresh.compute_logprobs(batch)
    fresh.update(batch)  # NaN advantages: a non-finite gradient, skipped by the fused kernel
    assert all(torch.equal(tensor, weights[name]) for name, tensor in fresh.full_state_dict().items())


def test_only_the_last_k_checkpoints_are_kept_and_latest_points_to_the_newest(tiny_model_dir, tmp_path):
    worker = PolicyWorker(tiny_model_dir, CONFIG)
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, worker, {"step": step}, keep=2)
    assert checkpoint_steps(tmp_path) == [3, 4]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_000004\n"


def test_a_run_with_only_a_killed_save_has_nothing_to_resume(tiny_model_dir, tmp_path):
    (tmp_path / "checkpoints" / "step_000001.tmp" / "state").mkdir(parents=True)
    assert load_latest_checkpoint(tmp_path, PolicyWorker(tiny_model_dir, CONFIG)) is None
    assert load_latest_checkpoint(tmp_path / "never_ran", PolicyWorker(tiny_model_dir, CONFIG)) is None


def test_a_missing_latest_pointer_falls_back_to_the_newest_complete_checkpoint(tiny_model_dir, tmp_path):
    worker = PolicyWorker(tiny_model_dir, CONFIG)
    save_checkpoint(tmp_path, 1, worker, {"step": 1})
    save_checkpoint(tmp_path, 2, worker, {"step": 2})
    (tmp_path / "checkpoints" / "latest").unlink()  # killed between the rename and the pointer update
    assert load_latest_checkpoint(tmp_path, PolicyWorker(tiny_model_dir, CONFIG)) == (2, {"step": 2})


def test_trainer_state_that_is_not_json_is_rejected_before_anything_is_written(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="JSON-serializable"):
        save_checkpoint(tmp_path, 1, PolicyWorker(tiny_model_dir, CONFIG), {"when": object()})
    assert not (tmp_path / "checkpoints").exists()
