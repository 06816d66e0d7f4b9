"""Packed attention on the GPU: one variable-length flash call for the whole packed row (never
cuDNN's attention, which builds a plan for every new sequence length), with the per-document
result and gradients."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from agentrl.trainer.document_attention import document_causal_attention, runs_varlen_flash
from tests.trainer.test_document_attention import block_causal_attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
LENGTHS = [100, 300, 57, 1]


def packed(heads: int, generator: torch.Generator) -> torch.Tensor:
    """[1, heads, N, 64] in bf16, laid out as the decoder's projections leave it ([1, N, heads, 64] transposed)."""
    tensor = torch.randn(1, sum(LENGTHS), heads, 64, device="cuda", generator=generator, dtype=torch.bfloat16)
    return tensor.transpose(1, 2).requires_grad_()


def test_bf16_packed_attention_is_one_flash_call_with_per_document_output_and_gradients():
    generator = torch.Generator(device="cuda").manual_seed(0)
    query, key, value = packed(14, generator), packed(2, generator), packed(2, generator)
    assert runs_varlen_flash(query)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        output, _ = document_causal_attention(
            torch.nn.Module(), query, key, value, None, scaling=0.125, document_lengths=torch.tensor(LENGTHS)
        )
        torch.cuda.synchronize()
    kernels = [(event.key.lower(), event.count) for event in profile.key_averages()]
    assert [count for name, count in kernels if "flash_fwd" in name] == [1], kernels
    assert not any("cudnn" in name for name, _ in kernels), kernels

    inputs = [tensor.detach().float().requires_grad_() for tensor in (query, key, value)]
    expected = block_causal_attention(*inputs, LENGTHS, scale=0.125)
    assert output.shape == (1, sum(LENGTHS), 14, 64)
    assert_close(output.float(), expected, atol=2e-2, rtol=2e-2)

    grad_output = torch.randn(output.shape, device="cuda", generator=generator)
    output.backward(grad_output.to(output.dtype))
    expected.backward(grad_output)
    for tensor, reference in zip((query, key, value), inputs, strict=True):
        assert tensor.grad.shape == tensor.shape
        assert_close(tensor.grad.float(), reference.grad, atol=5e-2, rtol=5e-2)


def test_float32_packed_attention_on_the_gpu_runs_per_document():
    generator = torch.Generator(device="cuda").manual_seed(1)
    query, key, value = (packed(heads, generator).detach().float() for heads in (14, 2, 2))
    assert not runs_varlen_flash(query)
    output, _ = document_causal_attention(
        torch.nn.Module(), query, key, value, None, document_lengths=torch.tensor(LENGTHS)
    )
    assert_close(output, block_causal_attention(query, key, value, LENGTHS), atol=1e-4, rtol=1e-4)
