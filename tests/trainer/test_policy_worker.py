import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.trainer.actor_config import ActorConfig
from agentrl.trainer.batch import build_train_batch
from agentrl.trainer.policy_worker import PolicyWorker
from tests.trainer.tiny_model import PAD_TOKEN_ID, short_trajectory, two_turn_trajectory

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def multi_turn_batch():
    trajectories = [two_turn_trajectory(0), short_trajectory(0, [4, 9]), short_trajectory(1, [5, 6, 7])]
    return build_train_batch(trajectories, torch.tensor([1.0, -1.0, 0.5]), PAD_TOKEN_ID)


def actor_config(**overrides) -> ActorConfig:
    settings = {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 4, "optim": {"lr": 1e-2}}
    return ActorConfig(**{**settings, **overrides})


def test_compute_logprobs_matches_log_softmax_of_tempered_logits(tiny_model_dir):
    batch = multi_turn_batch()
    worker = PolicyWorker(tiny_model_dir, actor_config(ppo_micro_batch_size_per_gpu=2), temperature=0.7)
    logprobs, entropy = worker.compute_logprobs(batch)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    log_probs = F.log_softmax(logits.float() / 0.7, dim=-1)
    # logits at position t - 1 predict token t
    expected = log_probs[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    expected_entropy = -(log_probs.exp() * log_probs).sum(-1)[:, :-1]
    real = batch.attention_mask[:, 1:].bool()
    assert_close(logprobs[:, 1:][real], expected[real], atol=1e-5, rtol=1e-5)
    assert_close(entropy[:, 1:][real], expected_entropy[real], atol=1e-5, rtol=1e-5)
    assert logprobs[:, 0].tolist() == [0.0, 0.0, 0.0]


def test_loss_gradient_is_exactly_zero_at_prompt_and_observation_logits(tiny_model_dir):
    batch = multi_turn_batch()
    config = actor_config(use_kl_loss=True, kl_loss_type="k3+", entropy_coeff=0.01)
    worker = PolicyWorker(tiny_model_dir, config)
    batch.old_logprobs, _ = worker.compute_logprobs(batch)
    batch.ref_logprobs = batch.old_logprobs + 0.3
    captured = []

    def keep_logits(module, inputs, output):
        output.retain_grad()
        captured.append(output)

    handle = worker.model.lm_head.register_forward_hook(keep_logits)
    worker.update(batch)
    handle.remove()
    # one mini-batch (two groups), one micro-batch: all three rows; the logits at t predict token t + 1
    grad_norms = captured[0].grad.abs().sum(-1)  # [3, T]
    predicts_sampled = batch.loss_mask[:, 1:] > 0
    assert (grad_norms[:, :-1][~predicts_sampled] == 0).all()
    assert (grad_norms[:, -1] == 0).all()
    assert (grad_norms[:, :-1][predicts_sampled] > 0).all()
    # the two-turn row: prompt [2 3], sampled [4 5], observation [6 7 8], sampled [9 1]
    assert (grad_norms[0] > 0).tolist() == [False, True, True, False, False, False, True, True, False]


def test_one_update_changes_the_weights_and_reports_every_metric(tiny_model_dir):
    batch = multi_turn_batch()
    worker = PolicyWorker(tiny_model_dir, actor_config(use_kl_loss=True))
    before = {name: tensor.clone() for name, tensor in worker.full_state_dict().items()}
    batch.old_logprobs, _ = worker.compute_logprobs(batch)
    batch.ref_logprobs = batch.old_logprobs
    metrics = worker.update(batch)
    after = worker.full_state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)
    assert set(metrics) == {
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/entropy",
        "actor/pg_clipfrac",
        "actor/pg_clipfrac_lower",
        "actor/ppo_kl",
        "actor/grad_norm",
        "actor/lr",
    }
    assert metrics["actor/grad_norm"] > 0
    assert metrics["actor/lr"] == 1e-2


def test_micro_batch_size_does_not_change_the_update(tiny_model_dir):
    results = []
    for micro_batch_size in (1, 2, 4):
        batch = multi_turn_batch()
        worker = PolicyWorker(tiny_model_dir, actor_config(ppo_micro_batch_size_per_gpu=micro_batch_size))
        batch.old_logprobs, _ = worker.compute_logprobs(batch)
        metrics = worker.update(batch)
        results.append((metrics, worker.full_state_dict()))
    reference_metrics, reference_state = results[0]
    for metrics, state in results[1:]:
        assert metrics["actor/grad_norm"] == pytest.approx(reference_metrics["actor/grad_norm"], rel=1e-5)
        assert metrics["actor/pg_loss"] == pytest.approx(
            reference_metrics["actor/pg_loss"], rel=1e-5, abs=1e-7
        )
        for name, tensor in state.items():
            assert_close(tensor, reference_state[name], atol=1e-6, rtol=1e-5)


def test_a_reference_worker_cannot_update(tiny_model_dir):
    batch = multi_turn_batch()
    reference = PolicyWorker(tiny_model_dir, actor_config(), trainable=False)
    batch.old_logprobs, _ = reference.compute_logprobs(batch)
    assert reference.optimizer is None
    with pytest.raises(ValueError, match="trainable=False"):
        reference.update(batch)


def test_update_without_old_logprobs_names_the_missing_step(tiny_model_dir):
    worker = PolicyWorker(tiny_model_dir, actor_config())
    with pytest.raises(ValueError, match="compute_logprobs"):
        worker.update(multi_turn_batch())


def test_save_hf_writes_a_checkpoint_transformers_loads(tiny_model_dir, tmp_path):
    worker = PolicyWorker(tiny_model_dir, actor_config())
    batch = multi_turn_batch()
    batch.old_logprobs, _ = worker.compute_logprobs(batch)
    worker.update(batch)
    worker.save_hf(tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    for name, tensor in worker.full_state_dict().items():
        assert torch.equal(loaded[name], tensor)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "hf" / name).read_bytes() == (tiny_model_dir / name).read_bytes()
    assert (
        AutoTokenizer.from_pretrained(tmp_path / "hf").get_vocab()
        == AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()
    )


def _run_update_script(launcher: list[str], model_dir: Path, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    script = REPO_ROOT / "tests" / "trainer" / "two_rank_update.py"
    completed = subprocess.run(
        [*launcher, str(script), str(model_dir), str(out)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return torch.load(out)


def test_two_ranks_under_torchrun_match_one_process(tiny_model_dir, tmp_path):
    one = _run_update_script([sys.executable], tiny_model_dir, tmp_path / "one.pt")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    two = _run_update_script(torchrun, tiny_model_dir, tmp_path / "two.pt")
    for name in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert two["metrics"][name] == pytest.approx(one["metrics"][name], rel=1e-5)
    for name, tensor in one["state"].items():
        assert_close(two["state"][name], tensor, atol=1e-6, rtol=1e-5)
    assert_close(two["logprobs"], one["logprobs"], atol=1e-5, rtol=1e-5)
