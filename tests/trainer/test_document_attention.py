"""Packed attention on the CPU: each document attends causally to itself alone."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from agentrl.trainer.document_attention import document_causal_attention


def block_causal_attention(
    query: torch.Tensor,  # [1, heads, N, D]
    key: torch.Tensor,  # [1, kv heads, N, D]
    value: torch.Tensor,
    lengths: list[int],
    scale: float | None = None,
) -> torch.Tensor:  # [1, N, heads, D]
    """Reference: dense attention under an explicit block-diagonal causal mask, K/V heads repeated."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    document = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(query.device)
    position = torch.arange(len(document), device=query.device)
    allowed = (document[:, None] == document[None, :]) & (position[:, None] >= position[None, :])
    scores = query @ key.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(query.shape[-1]))
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return (weights @ value).transpose(1, 2)


def test_packed_attention_matches_block_causal_attention_in_output_and_gradients():
    lengths = [5, 1, 9, 3]
    generator = torch.Generator().manual_seed(0)
    query, key, value = (
        torch.randn(1, heads, sum(lengths), 8, generator=generator, dtype=torch.float64, requires_grad=True)
        for heads in (4, 2, 2)
    )
    output, _ = document_causal_attention(
        torch.nn.Module(), query, key, value, None, scaling=0.3, document_lengths=torch.tensor(lengths)
    )
    inputs = [tensor.detach().clone().requires_grad_() for tensor in (query, key, value)]
    expected = block_causal_attention(*inputs, lengths, scale=0.3)
    assert_close(output, expected)
    grad_output = torch.randn(output.shape, generator=generator, dtype=torch.float64)
    output.backward(grad_output)
    expected.backward(grad_output)
    for tensor, reference in zip((query, key, value), inputs, strict=True):
        assert_close(tensor.grad, reference.grad)


def test_packed_attention_rejects_lengths_that_do_not_cover_the_row_and_sliding_windows():
    query = torch.zeros(1, 2, 6, 4)
    with pytest.raises(ValueError, match=r"document_lengths summing to its length; got .* \[2, 3\]"):
        document_causal_attention(
            torch.nn.Module(), query, query, query, None, document_lengths=torch.tensor([2, 3])
        )
    with pytest.raises(ValueError, match="set actor.sequence_packing=false"):
        document_causal_attention(
            torch.nn.Module(), query, query, query, None, sliding_window=4, document_lengths=torch.tensor([6])
        )
