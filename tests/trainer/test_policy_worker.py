import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.trainer.batch import build_train_batch
from agentrl.trainer.policy_worker import PolicyWorker
from tests.trainer.tiny_model import (
    PAD_TOKEN_ID,
    actor_config,
    multi_turn_batch,
    short_trajectory,
    write_tiny_model,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_thread")


def full_logits_reference(model_dir, batch, temperature):
    """Logprobs [B, T] and entropy [B, T] of every token from the model's own full logits."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    log_probs = F.log_softmax(logits.float() / temperature, dim=-1)
    # logits at position t - 1 predict token t
    logprobs = log_probs[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)[:, :-1]
    return F.pad(logprobs, (1, 0)), F.pad(entropy, (1, 0))


@pytest.mark.parametrize("sequence_packing", [True, False])
def test_compute_logprobs_matches_log_softmax_of_tempered_logits_on_sampled_tokens(
    tiny_model_dir, sequence_packing
):
    batch = multi_turn_batch()
    actor = actor_config(
        ppo_micro_batch_size_per_gpu=2, sequence_packing=sequence_packing, logprob_chunk_size=3
    )
    worker = PolicyWorker(tiny_model_dir, actor, temperature=0.7)
    logprobs, entropy = worker.compute_logprobs(batch, with_entropy=True)
    expected, expected_entropy = full_logits_reference(tiny_model_dir, batch, 0.7)
    sampled = batch.loss_mask > 0
    assert_close(logprobs[sampled], expected[sampled], atol=1e-5, rtol=1e-5)
    assert_close(entropy[sampled], expected_entropy[sampled], atol=1e-5, rtol=1e-5)
    # prompt, observation and padding tokens are never scored
    assert (logprobs[~sampled] == 0).all() and (entropy[~sampled] == 0).all()


def test_compute_logprobs_returns_no_entropy_unless_asked(tiny_model_dir):
    worker = PolicyWorker(tiny_model_dir, actor_config())
    logprobs, entropy = worker.compute_logprobs(multi_turn_batch())
    assert entropy is None
    assert logprobs.shape == (3, 9)


@pytest.mark.parametrize("sequence_packing", [True, False])
def test_loss_gradient_is_exactly_zero_at_prompt_and_observation_hidden_states(
    tiny_model_dir, sequence_packing
):
    batch = multi_turn_batch()
    config = actor_config(
        use_kl_loss=True, kl_loss_type="k3+", entropy_coeff=0.01, sequence_packing=sequence_packing
    )
    worker = PolicyWorker(tiny_model_dir, config)
    batch.old_logprobs, _ = worker.compute_logprobs(batch)
    batch.ref_logprobs = batch.old_logprobs + 0.3
    captured = []

    def keep_hidden(module, inputs, output):
        output.retain_grad()
        captured.append(output)

    handle = worker.model.model.norm.register_forward_hook(keep_hidden)
    worker.update(batch)
    handle.remove()
    # one mini-batch (two groups), one micro-batch: all three rows; the state at t predicts token t + 1
    grad_norms = captured[0].grad.abs().sum(-1)  # [3, T] padded, [1, 16] packed
    if sequence_packing:
        grad_norms = torch.zeros(batch.input_ids.shape).masked_scatter(
            batch.attention_mask.bool(), grad_norms
        )
    predicts_sampled = batch.loss_mask[:, 1:] > 0
    assert (grad_norms[:, :-1][~predicts_sampled] == 0).all()
    assert (grad_norms[:, -1] == 0).all()
    assert (grad_norms[:, :-1][predicts_sampled] > 0).all()
    # the two-turn row: prompt [2 3], sampled [4 5], observation [6 7 8], sampled [9 1]
    assert (grad_norms[0] > 0).tolist() == [False, True, True, False, False, False, True, True, False]


def test_one_update_changes_the_weights_and_reports_every_computed_metric(tiny_model_dir):
    batch = multi_turn_batch()
    worker = PolicyWorker(tiny_model_dir, actor_config(use_kl_loss=True))
    before = {name: tensor.clone() for name, tensor in worker.full_state_dict().items()}
    batch.old_logprobs, _ = worker.compute_logprobs(batch)
    batch.ref_logprobs = batch.old_logprobs
    metrics = worker.update(batch)
    after = worker.full_state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)
    # entropy_coeff is 0 and report_entropy is off: the entropy is never computed, so not reported
    assert set(metrics) == {
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/pg_clipfrac",
        "actor/pg_clipfrac_lower",
        "actor/ppo_kl",
        "actor/grad_norm",
        "actor/lr",
    }
    assert metrics["actor/grad_norm"] > 0
    assert metrics["actor/lr"] == 1e-2


def test_report_entropy_adds_the_token_mean_entropy_without_changing_the_update(tiny_model_dir):
    results = []
    for report_entropy in (False, True):
        batch = multi_turn_batch()
        worker = PolicyWorker(tiny_model_dir, actor_config(report_entropy=report_entropy))
        batch.old_logprobs, entropy = worker.compute_logprobs(batch, with_entropy=True)
        results.append((worker.update(batch), worker.full_state_dict()))
    (plain, plain_state), (reported, reported_state) = results
    sampled = batch.loss_mask > 0
    assert reported["actor/entropy"] == pytest.approx(float(entropy[sampled].mean()), rel=1e-5)
    assert reported["actor/grad_norm"] == plain["actor/grad_norm"]
    for name, tensor in plain_state.items():
        assert torch.equal(reported_state[name], tensor)


@pytest.mark.parametrize("sequence_packing", [True, False])
def test_micro_batch_size_does_not_change_the_update(tiny_model_dir, sequence_packing):
    results = []
    for micro_batch_size in (1, 2, 4):
        batch = multi_turn_batch()
        actor = actor_config(ppo_micro_batch_size_per_gpu=micro_batch_size, sequence_packing=sequence_packing)
        worker = PolicyWorker(tiny_model_dir, actor)
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


def updated(model_dir, **overrides):
    """Metrics and weights after one update with KL and entropy terms, under `overrides`."""
    batch = multi_turn_batch()
    actor = actor_config(
        loss_agg_mode="seq-mean-token-sum-norm", use_kl_loss=True, entropy_coeff=0.01, **overrides
    )
    worker = PolicyWorker(model_dir, actor, temperature=0.8)
    batch.old_logprobs, _ = worker.compute_logprobs(batch)
    batch.ref_logprobs = batch.old_logprobs - 0.2
    return worker.update(batch), worker.full_state_dict()


@pytest.mark.parametrize(
    "overrides",
    [{"sequence_packing": True}, {"gradient_checkpointing": True}, {"logprob_chunk_size": 1}],
    ids=["packing", "checkpointing", "chunk_size_1"],
)
def test_packing_checkpointing_and_chunk_size_give_the_loss_and_gradients_of_the_padded_path(
    tiny_model_dir, overrides
):
    baseline = {"sequence_packing": False, "gradient_checkpointing": False, "logprob_chunk_size": 2048}
    padded_metrics, padded_state = updated(tiny_model_dir, **baseline)
    metrics, state = updated(tiny_model_dir, **{**baseline, **overrides})
    for name in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert metrics[name] == pytest.approx(padded_metrics[name], rel=1e-5, abs=1e-7)
    for name, tensor in state.items():
        assert_close(tensor, padded_state[name], atol=1e-6, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("sequence_packing", [True, False], ids=["packed", "padded"])
def test_compiled_layers_give_the_loss_and_gradients_of_eager_ones(tiny_model_dir, sequence_packing):
    settings = {"gradient_checkpointing": True, "sequence_packing": sequence_packing}
    eager_metrics, eager_state = updated(tiny_model_dir, **settings)
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    metrics, state = updated(tiny_model_dir, use_torch_compile=True, **settings)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs_before  # it did compile
    for name in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert metrics[name] == pytest.approx(eager_metrics[name], rel=1e-5, abs=1e-7)
    for name, tensor in state.items():  # fused kernels round differently: 1e-5 after one step
        assert_close(tensor, eager_state[name], atol=1e-5, rtol=1e-4)


def test_gradient_checkpointing_recomputes_each_layer_in_backward(tiny_model_dir):
    calls = {}
    for checkpointing in (False, True):
        batch = multi_turn_batch()
        worker = PolicyWorker(tiny_model_dir, actor_config(gradient_checkpointing=checkpointing))
        batch.old_logprobs, _ = worker.compute_logprobs(batch)
        mlp = worker.model.model.layers[0].mlp
        count = []
        # a pre-hook: the recompute stops as soon as the last saved tensor is rebuilt, inside the MLP
        handle = mlp.register_forward_pre_hook(lambda *args, count=count: count.append(1))
        worker.update(batch)
        handle.remove()
        calls[checkpointing] = len(count)
    # one mini-batch, one micro-batch: one forward, plus one recompute when checkpointing
    assert calls == {False: 1, True: 2}


def test_full_state_dict_in_the_engine_dtype_on_the_worker_device_is_a_copy(tiny_model_dir):
    worker = PolicyWorker(tiny_model_dir, actor_config())
    float32 = worker.full_state_dict()
    bf16 = worker.full_state_dict(device=None, dtype=torch.bfloat16)
    assert bf16.keys() == float32.keys()
    for name, tensor in bf16.items():
        assert tensor.dtype == torch.bfloat16 and tensor.device == worker.context.device
        assert torch.equal(tensor, float32[name].to(torch.bfloat16))
    bf16["model.norm.weight"].add_(1.0)
    assert torch.equal(worker.full_state_dict()["model.norm.weight"], float32["model.norm.weight"])


def test_full_state_dict_keeps_tied_weights_one_tensor(tmp_path):
    model_dir = write_tiny_model(tmp_path, tie_word_embeddings=True)
    state = PolicyWorker(model_dir, actor_config()).full_state_dict(dtype=torch.bfloat16)
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"]
    loaded = AutoModelForCausalLM.from_pretrained(model_dir)
    assert torch.equal(state["model.embed_tokens.weight"], loaded.lm_head.weight.detach().bfloat16())


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


@pytest.mark.slow
def test_compiled_layers_stop_recompiling_once_token_and_document_counts_have_varied(tiny_model_dir):
    # Compiled code is shared by the process: other tests' head kernels (other temperatures, dtypes,
    # entropy or not) would count against the same recompile limit as this worker's.
    torch._dynamo.reset()
    actor = actor_config(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=8, use_torch_compile=True)
    worker = PolicyWorker(tiny_model_dir, actor)
    counters = torch._dynamo.utils.counters
    limit_hits_before = sum(
        n for reason, n in counters["unimplemented"].items() if "recompile limit" in reason
    )
    compiled_frames = []
    # Every batch is one packed micro-batch with its own number of documents and of tokens.
    for responses in (
        [[4, 5]] * 2, [[4, 5, 6]] * 3, [[7]] * 5, [[4, 9, 8, 7]] * 4, [[5, 6]] * 6, [[9]] * 7, [[6, 7, 8]] * 8,
    ):  # fmt: skip
        trajectories = [short_trajectory(group, ids) for group, ids in enumerate(responses)]
        batch = build_train_batch(trajectories, torch.ones(len(responses)), PAD_TOKEN_ID)
        batch.old_logprobs, _ = worker.compute_logprobs(batch)
        worker.update(batch)
        compiled_frames.append(counters["frames"]["total"])
    # The first batches compile (static shapes, then dynamic token and document counts); after
    # that nothing. A graph per number of
    # documents would recompile until dynamo's recompile limit and then leave the layers eager.
    assert compiled_frames[-4:] == [compiled_frames[-4]] * 4, compiled_frames
    assert (
        sum(n for reason, n in counters["unimplemented"].items() if "recompile limit" in reason)
        == limit_hits_before
    )
