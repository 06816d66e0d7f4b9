import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from agentrl.trainer.token_logprobs import token_logprobs

NUM_TOKENS, HIDDEN, VOCAB = 7, 5, 11


def inputs(dtype: torch.dtype = torch.float64, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(NUM_TOKENS, HIDDEN, generator=generator, dtype=dtype) * 2
    weight = torch.randn(VOCAB, HIDDEN, generator=generator, dtype=dtype)
    targets = torch.randint(0, VOCAB, (NUM_TOKENS,), generator=generator)
    return hidden.requires_grad_(), weight.requires_grad_(), targets


def full_logits_path(hidden, weight, targets, temperature):
    """The previous trainer path: every logit, log_softmax, gather, and entropy from the log-probs."""
    log_probs = F.log_softmax((hidden @ weight.T).float() / temperature, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(-1, targets[:, None]).squeeze(-1), entropy


def surrogate(logprobs, entropy):
    """A loss that weighs every token differently, so wrong per-row gradients cannot cancel."""
    weights = torch.arange(1, NUM_TOKENS + 1, dtype=logprobs.dtype)
    return (weights * logprobs.exp()).sum() - 0.3 * (weights.flip(0) * entropy).sum()


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_entropy_and_gradients_equal_the_full_logits_path(chunk_size, temperature):
    hidden, weight, targets = inputs()
    scores = token_logprobs(hidden, weight, targets, temperature, chunk_size, with_entropy=True)
    surrogate(scores.logprobs, scores.entropy).backward()
    chunked_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    expected_logprobs, expected_entropy = full_logits_path(hidden, weight, targets, temperature)
    surrogate(expected_logprobs, expected_entropy).backward()
    assert_close(scores.logprobs, expected_logprobs.float(), atol=1e-5, rtol=1e-5)
    assert_close(scores.entropy, expected_entropy.float(), atol=1e-5, rtol=1e-5)
    assert_close(chunked_grads[0], hidden.grad, atol=1e-5, rtol=1e-5)
    assert_close(chunked_grads[1], weight.grad, atol=1e-5, rtol=1e-5)


def test_without_entropy_the_logprob_gradient_still_equals_the_full_path():
    hidden, weight, targets = inputs(torch.float32, seed=1)
    scores = token_logprobs(hidden, weight, targets, 0.5, chunk_size=2)
    assert scores.entropy is None
    (scores.logprobs * torch.arange(NUM_TOKENS)).sum().backward()
    chunked_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    expected, _ = full_logits_path(hidden, weight, targets, 0.5)
    (expected * torch.arange(NUM_TOKENS)).sum().backward()
    assert_close(scores.logprobs, expected, atol=1e-5, rtol=1e-5)
    assert_close(chunked_grads[0], hidden.grad, atol=1e-5, rtol=1e-5)
    assert_close(chunked_grads[1], weight.grad, atol=1e-5, rtol=1e-5)


def test_autograd_saves_the_hidden_states_weight_and_per_token_values_never_a_vocabulary_sized_tensor():
    hidden, weight, targets = inputs(torch.float32)
    saved_shapes = []

    def pack(tensor):
        saved_shapes.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        token_logprobs(hidden, weight, targets, 0.7, chunk_size=3, with_entropy=True)
        # targets, log-normalisers and entropies [N]; hidden states [N, H]; weight [V, H]
    assert sorted(saved_shapes) == [(NUM_TOKENS,)] * 3 + [(NUM_TOKENS, HIDDEN), (VOCAB, HIDDEN)]


def test_bf16_hidden_states_give_the_float32_logprobs_of_the_full_bf16_logits_path():
    hidden, weight, targets = inputs(torch.float32, seed=2)
    hidden, weight = hidden.detach().bfloat16(), weight.detach().bfloat16()
    scores = token_logprobs(hidden, weight, targets, chunk_size=4)
    expected, _ = full_logits_path(hidden, weight, targets, 1.0)
    assert scores.logprobs.dtype == torch.float32
    assert_close(scores.logprobs, expected, atol=1e-6, rtol=1e-6)


def test_no_scored_tokens_gives_empty_results_and_zero_weight_gradient():
    _, weight, _ = inputs(torch.float32)
    hidden = torch.zeros(0, HIDDEN, requires_grad=True)
    scores = token_logprobs(hidden, weight, torch.zeros(0, dtype=torch.int64))
    scores.logprobs.sum().backward()
    assert scores.logprobs.shape == (0,)
    assert weight.grad is not None and (weight.grad == 0).all()


def test_a_chunk_size_below_one_is_rejected():
    hidden, weight, targets = inputs()
    with pytest.raises(ValueError, match="chunk_size must be >= 1 rows, got 0"):
        token_logprobs(hidden, weight, targets, chunk_size=0)


@pytest.mark.slow
@pytest.mark.parametrize("with_entropy", [True, False])
def test_the_compiled_chunk_kernels_give_the_full_logits_path_values_and_gradients(with_entropy):
    hidden, weight, targets = inputs(torch.float32, seed=3)
    scores = token_logprobs(
        hidden, weight, targets, 0.7, chunk_size=3, with_entropy=with_entropy, compiled=True
    )
    entropy = scores.entropy if with_entropy else torch.zeros(NUM_TOKENS)
    surrogate(scores.logprobs, entropy).backward()
    compiled_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    expected_logprobs, expected_entropy = full_logits_path(hidden, weight, targets, 0.7)
    surrogate(expected_logprobs, expected_entropy if with_entropy else torch.zeros(NUM_TOKENS)).backward()
    assert_close(scores.logprobs, expected_logprobs, atol=1e-5, rtol=1e-5)
    if with_entropy:
        assert_close(scores.entropy, expected_entropy, atol=1e-5, rtol=1e-5)
    assert_close(compiled_grads[0], hidden.grad, atol=1e-5, rtol=1e-5)
    assert_close(compiled_grads[1], weight.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_the_compiled_chunk_kernels_compile_once_for_every_chunk_offset_and_row_count():
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(VOCAB, HIDDEN, generator=generator, requires_grad=True)
    counters = torch._dynamo.utils.counters

    def score(num_tokens: int) -> None:
        hidden = torch.randn(num_tokens, HIDDEN, generator=generator, requires_grad=True)
        targets = torch.randint(0, VOCAB, (num_tokens,), generator=generator)
        scores = token_logprobs(hidden, weight, targets, chunk_size=4, with_entropy=True, compiled=True)
        (scores.logprobs.sum() + scores.entropy.sum()).backward()

    score(10)  # chunks of 4, 4 and 2 rows at offsets 0, 4 and 8: each kernel compiles here
    compiled_frames = counters["frames"]["total"]
    for num_tokens in (7, 14, 3, 12, 6):  # other offsets, other last-chunk sizes, a single short chunk
        score(num_tokens)
    assert counters["frames"]["total"] == compiled_frames
