import pytest
import torch
from torch.testing import assert_close

from agentrl.trainer.head_loss import head_loss
from tests.trainer.test_token_logprobs import HIDDEN, NUM_TOKENS, VOCAB, full_logits_path, inputs


def head_inputs(dtype: torch.dtype = torch.float64, seed: int = 0):
    hidden, weight, targets = inputs(dtype, seed)
    return hidden.requires_grad_(), weight.requires_grad_(), targets


def per_token_loss(tokens: slice, logprobs: torch.Tensor, entropy: torch.Tensor | None) -> torch.Tensor:
    """A sum of per-token terms, each token weighed differently (wrong per-row gradients cannot cancel)."""
    weights = torch.arange(1, NUM_TOKENS + 1, dtype=logprobs.dtype)
    loss = (weights[tokens] * logprobs.exp()).sum()
    return loss if entropy is None else loss - 0.3 * (weights.flip(0)[tokens] * entropy).sum()


def full_path_gradients(hidden, weight, targets, temperature, with_entropy, upstream=1.0):
    """(loss, d loss / d hidden, d loss / d weight) by autograd through every logit."""
    hidden.grad = weight.grad = None
    logprobs, entropy = full_logits_path(hidden, weight, targets, temperature)
    loss = per_token_loss(slice(None), logprobs, entropy if with_entropy else None)
    (upstream * loss).backward()
    return loss.detach(), hidden.grad.clone(), weight.grad.clone()


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_head_loss_gives_the_loss_gradients_and_scores_of_autograd_through_the_full_logits(
    chunk_size, temperature, with_entropy
):
    hidden, weight, targets = head_inputs()
    loss, scores = head_loss(hidden, weight, targets, per_token_loss, temperature, chunk_size, with_entropy)
    assert not scores.logprobs.requires_grad
    (2.5 * loss).backward()  # the upstream gradient scales the stored ones
    fused_grads = hidden.grad.clone(), weight.grad.clone()
    expected_loss, *expected_grads = full_path_gradients(
        hidden, weight, targets, temperature, with_entropy, 2.5
    )
    expected_logprobs, expected_entropy = full_logits_path(
        hidden.detach(), weight.detach(), targets, temperature
    )
    assert_close(loss, expected_loss, atol=1e-5, rtol=1e-5)
    assert_close(scores.logprobs, expected_logprobs, atol=1e-5, rtol=1e-5)
    if with_entropy:
        assert_close(scores.entropy, expected_entropy, atol=1e-5, rtol=1e-5)
    else:
        assert scores.entropy is None
    assert_close(fused_grads[0], expected_grads[0], atol=1e-5, rtol=1e-5)
    assert_close(fused_grads[1], expected_grads[1], atol=1e-5, rtol=1e-5)


def test_autograd_keeps_the_two_gradients_and_chunk_vectors_never_a_vocabulary_sized_tensor():
    hidden, weight, targets = head_inputs(torch.float32)
    saved_shapes = []

    def pack(tensor):
        saved_shapes.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        head_loss(hidden, weight, targets, per_token_loss, 0.7, chunk_size=3, with_entropy=True)
    # kept for backward: the two gradients; saved (and freed) while each chunk's per-token loss is
    # differentiated: vectors of at most a chunk's 3 values
    assert sorted(shape for shape in saved_shapes if len(shape) == 2) == [
        (NUM_TOKENS, HIDDEN),
        (VOCAB, HIDDEN),
    ]
    assert all(len(shape) < 2 and shape[:1] <= (3,) for shape in saved_shapes if len(shape) != 2)


def test_no_scored_tokens_gives_a_zero_loss_and_zero_gradients():
    _, weight, _ = head_inputs(torch.float32)
    hidden = torch.zeros(0, HIDDEN, requires_grad=True)
    loss, scores = head_loss(hidden, weight, torch.zeros(0, dtype=torch.int64), per_token_loss)
    loss.backward()
    assert float(loss.detach()) == 0.0 and scores.logprobs.shape == (0,)
    assert hidden.grad.shape == (0, HIDDEN) and (weight.grad == 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("with_entropy", [True, False])
def test_the_compiled_chunk_kernels_give_the_full_logits_path_loss_and_gradients(with_entropy):
    hidden, weight, targets = head_inputs(torch.float32, seed=3)
    loss, _ = head_loss(hidden, weight, targets, per_token_loss, 0.7, 3, with_entropy, compiled=True)
    loss.backward()
    compiled_grads = hidden.grad.clone(), weight.grad.clone()
    expected_loss, *expected_grads = full_path_gradients(hidden, weight, targets, 0.7, with_entropy)
    assert_close(loss, expected_loss, atol=1e-5, rtol=1e-5)
    assert_close(compiled_grads[0], expected_grads[0], atol=1e-5, rtol=1e-5)
    assert_close(compiled_grads[1], expected_grads[1], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_the_compiled_chunk_kernels_compile_once_for_every_chunk_offset_and_row_count():
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(VOCAB, HIDDEN, generator=generator, requires_grad=True)
    counters = torch._dynamo.utils.counters

    def score(num_tokens: int) -> None:
        hidden = torch.randn(num_tokens, HIDDEN, generator=generator, requires_grad=True)
        targets = torch.randint(0, VOCAB, (num_tokens,), generator=generator)

        def chunk_loss(tokens, logprobs, entropy):
            return logprobs.sum() + entropy.sum()

        loss, _ = head_loss(
            hidden, weight, targets, chunk_loss, chunk_size=4, with_entropy=True, compiled=True
        )
        loss.backward()

    score(10)  # chunks of 4, 4 and 2 rows at offsets 0, 4 and 8: each kernel compiles here
    compiled_frames = counters["frames"]["total"]
    for num_tokens in (7, 14, 3, 12, 6):  # other offsets, other last-chunk sizes, a single short chunk
        score(num_tokens)
    assert counters["frames"]["total"] == compiled_frames
