"""Packed attention on the GPU: the per-document result, on flash attention (never cuDNN's, which
builds a plan for every new sequence length)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from agentrl.trainer.document_attention import document_causal_attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_bf16_packed_attention_matches_float32_attention_per_document_and_does_not_run_cudnn():
    lengths = [100, 300, 57, 1]
    generator = torch.Generator(device="cuda").manual_seed(0)

    def random(heads: int) -> torch.Tensor:
        return torch.randn(
            1, heads, sum(lengths), 64, device="cuda", generator=generator, dtype=torch.bfloat16
        )

    query, key, value = random(14), random(2), random(2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        output, _ = document_causal_attention(
            torch.nn.Module(), query, key, value, None, document_lengths=torch.tensor(lengths)
        )
        torch.cuda.synchronize()
    kernels = [event.key.lower() for event in profile.key_averages()]
    assert any("flash" in name for name in kernels), kernels
    assert not any("cudnn" in name for name in kernels), kernels
    start, expected = 0, []
    for length in lengths:
        part = slice(start, start + length)
        expected.append(
            F.scaled_dot_product_attention(
                query[:, :, part].float(), key[:, :, part].float(), value[:, :, part].float(),
                is_causal=True, enable_gqa=True,
            ).transpose(1, 2)
        )  # fmt: skip
        start += length
    assert output.shape == (1, sum(lengths), 14, 64)
    assert_close(output.float(), torch.cat(expected, dim=1), atol=2e-2, rtol=2e-2)
