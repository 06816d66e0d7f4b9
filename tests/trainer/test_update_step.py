"""One PolicyWorker update against what it must equal: the textbook gradient, float32 loss values, a skipped step."""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.testing import assert_close
from transformers import AutoModelForCausalLM

from agentrl.trainer.loss import TokenLoss, micro_batch_loss
from agentrl.trainer.policy_worker import PolicyWorker
from tests.trainer.tiny_model import actor_config, multi_turn_batch

pytestmark = pytest.mark.usefixtures("one_thread")


def test_one_update_clips_the_gradient_of_plain_autograd_through_the_models_own_logits(tiny_model_dir):
    """The fused head inside FSDP against the textbook path: full logits, micro_batch_loss, backward."""
    batch = multi_turn_batch()
    actor = actor_config(
        loss_agg_mode="seq-mean-token-mean", use_kl_loss=True, entropy_coeff=0.05,
        ppo_micro_batch_size_per_gpu=2, grad_clip=0.05, logprob_chunk_size=3, sequence_packing=True,
    )  # fmt: skip
    worker = PolicyWorker(tiny_model_dir, actor, temperature=0.8)
    logprobs, _ = worker.compute_logprobs(batch)
    # old and reference policies away from the current one, so ratios clip and the KL term pulls
    shift = torch.linspace(-0.6, 0.6, batch.loss_mask.numel()).reshape(batch.loss_mask.shape)
    batch.old_logprobs = (logprobs + shift) * batch.loss_mask
    batch.ref_logprobs = (logprobs - shift.flip(-1)) * batch.loss_mask
    stepped = {}

    def keep_gradients(optimizer, args, kwargs) -> None:
        for name, parameter in worker.model.named_parameters():
            stepped[name] = parameter.grad.full_tensor().clone()

    worker.optimizer.register_step_pre_hook(keep_gradients)
    metrics = worker.update(batch)

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    log_probs = F.log_softmax(logits.float() / 0.8, dim=-1)
    token_logprobs = F.pad(log_probs[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1), (1, 0))
    entropy = F.pad(-(log_probs.exp() * log_probs).sum(-1)[:, :-1], (1, 0))
    num_tokens, num_sequences = float(batch.loss_mask.sum()), float((batch.loss_mask.sum(-1) > 0).sum())
    loss, _ = micro_batch_loss(token_logprobs, entropy, batch, actor, num_tokens, num_sequences)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), actor.grad_clip)

    assert float(grad_norm) > actor.grad_clip  # clipped: the scale depends on every gradient
    assert metrics["actor/grad_norm"] == pytest.approx(float(grad_norm), rel=1e-5)
    assert metrics["actor/pg_clipfrac"] > 0  # the clipped branch was taken
    expected = dict(model.named_parameters())
    assert stepped.keys() == expected.keys()
    for name, gradient in stepped.items():
        assert_close(gradient, expected[name].grad, atol=1e-7, rtol=1e-5)


def test_the_token_loss_keeps_its_float32_values_under_bf16_compute(tiny_model_dir, monkeypatch):
    seen = []
    original = TokenLoss.__call__

    def recording(self, tokens, logprobs, entropy):
        seen.append((self.old_logprobs.dtype, self.advantages.dtype, self.weights.dtype, logprobs.dtype))
        return original(self, tokens, logprobs, entropy)

    monkeypatch.setattr(TokenLoss, "__call__", recording)
    batch = multi_turn_batch()
    worker = PolicyWorker(tiny_model_dir, actor_config(), dtype=torch.bfloat16)
    batch.old_logprobs, _ = worker.compute_logprobs(batch)
    worker.update(batch)
    assert seen and all(dtypes == (torch.float32,) * 4 for dtypes in seen)


ON_CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
)


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
def test_a_non_finite_gradient_skips_the_step_and_leaves_weights_and_adamw_state_as_they_were(
    tiny_model_dir, device
):
    """The fused AdamW kernel skips the step on the device (found_inf); on CUDA too, under FSDP."""
    batch = multi_turn_batch()
    worker = PolicyWorker(tiny_model_dir, actor_config(), device=device)
    batch.old_logprobs, _ = worker.compute_logprobs(batch)
    worker.update(batch)  # a finite step first: the AdamW moments exist and are non-zero

    def optimizer_state() -> list[torch.Tensor]:
        values = [value for state in worker.optimizer.state.values() for value in state.values()]
        return [value.full_tensor() if isinstance(value, DTensor) else value.clone() for value in values]

    weights, state = worker.full_state_dict(), optimizer_state()
    poisoned = replace(batch, advantages=batch.advantages.masked_fill(batch.loss_mask > 0, float("nan")))
    metrics = worker.update(poisoned)
    assert math.isnan(metrics["actor/grad_norm"])
    for name, tensor in worker.full_state_dict().items():
        assert torch.equal(tensor, weights[name])
    assert len(state) == 3 * len(list(worker.model.parameters()))  # step and both moments of each
    for value, before in zip(optimizer_state(), state, strict=True):
        assert torch.equal(value, before)
    worker.update(batch)  # and the next finite step goes ahead
    assert any(not torch.equal(tensor, weights[name]) for name, tensor in worker.full_state_dict().items())
