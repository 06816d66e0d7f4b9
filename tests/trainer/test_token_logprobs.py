import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from agentrl.trainer.actor_config import ActorConfig
from agentrl.trainer.token_logprobs import DEFAULT_CHUNK_SIZE, token_logprobs

NUM_TOKENS, HIDDEN, VOCAB = 7, 5, 11


def inputs(dtype: torch.dtype = torch.float64, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(NUM_TOKENS, HIDDEN, generator=generator, dtype=dtype) * 2
    weight = torch.randn(VOCAB, HIDDEN, generator=generator, dtype=dtype)
    targets = torch.randint(0, VOCAB, (NUM_TOKENS,), generator=generator)
    return hidden, weight, targets


def full_logits_path(hidden, weight, targets, temperature):
    """The previous trainer path: every logit, log_softmax, gather, and entropy from the log-probs."""
    log_probs = F.log_softmax((hidden @ weight.T).float() / temperature, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(-1, targets[:, None]).squeeze(-1), entropy


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_and_entropy_equal_the_full_logits_path(chunk_size, temperature):
    hidden, weight, targets = inputs()
    scores = token_logprobs(hidden, weight, targets, temperature, chunk_size, with_entropy=True)
    expected_logprobs, expected_entropy = full_logits_path(hidden, weight, targets, temperature)
    assert scores.logprobs.dtype == scores.entropy.dtype == torch.float32
    assert_close(scores.logprobs, expected_logprobs, atol=1e-5, rtol=1e-5)
    assert_close(scores.entropy, expected_entropy, atol=1e-5, rtol=1e-5)


def test_without_entropy_only_the_logprobs_come_back():
    hidden, weight, targets = inputs(torch.float32, seed=1)
    scores = token_logprobs(hidden, weight, targets, 0.5, chunk_size=2)
    assert scores.entropy is None
    assert_close(scores.logprobs, full_logits_path(hidden, weight, targets, 0.5)[0], atol=1e-5, rtol=1e-5)


def test_bf16_hidden_states_give_the_float32_logprobs_of_the_full_bf16_logits_path():
    hidden, weight, targets = inputs(torch.float32, seed=2)
    hidden, weight = hidden.bfloat16(), weight.bfloat16()
    scores = token_logprobs(hidden, weight, targets, chunk_size=4)
    expected, _ = full_logits_path(hidden, weight, targets, 1.0)
    assert scores.logprobs.dtype == torch.float32
    assert_close(scores.logprobs, expected, atol=1e-6, rtol=1e-6)


def test_no_scored_tokens_gives_empty_results():
    _, weight, _ = inputs(torch.float32)
    scores = token_logprobs(
        torch.zeros(0, HIDDEN), weight, torch.zeros(0, dtype=torch.int64), with_entropy=True
    )
    assert scores.logprobs.shape == scores.entropy.shape == (0,)


def test_the_heads_default_chunk_is_the_configs():
    assert ActorConfig().logprob_chunk_size == DEFAULT_CHUNK_SIZE == 4096


def test_a_chunk_size_below_one_is_rejected():
    hidden, weight, targets = inputs()
    with pytest.raises(ValueError, match="chunk_size must be >= 1 rows, got 0"):
        token_logprobs(hidden, weight, targets, chunk_size=0)


def test_asked_for_a_gradient_it_refuses_and_names_head_loss():
    hidden, weight, targets = inputs()
    with pytest.raises(ValueError, match="no gradient.*head_loss"):
        token_logprobs(hidden.requires_grad_(), weight, targets)
    with torch.no_grad():  # how the policy's old and reference logprobs are scored
        assert token_logprobs(hidden, weight, targets).logprobs.shape == (NUM_TOKENS,)


@pytest.mark.slow
@pytest.mark.parametrize("with_entropy", [True, False])
def test_the_compiled_chunk_kernels_give_the_full_logits_path_values(with_entropy):
    hidden, weight, targets = inputs(torch.float32, seed=3)
    scores = token_logprobs(
        hidden, weight, targets, 0.7, chunk_size=3, with_entropy=with_entropy, compiled=True
    )
    expected_logprobs, expected_entropy = full_logits_path(hidden, weight, targets, 0.7)
    assert_close(scores.logprobs, expected_logprobs, atol=1e-5, rtol=1e-5)
    if with_entropy:
        assert_close(scores.entropy, expected_entropy, atol=1e-5, rtol=1e-5)
