"""Inference stage, attention over slot storage with grouped key/value heads left unexpanded.

The engine installs one attention function into a transformers model. Called with the
`slot_forward` keyword (the engine's own passes), it folds each group of query heads that
share a key/value head into the query-length dimension, `[rows, kv_heads, group * new, dim]`,
so one SDPA call reads every key and value once, with no `repeat_kv` copy. (For decode, two
batched matrix products with a float32 softmax between them measured slower.) On CUDA, a pass of
one new token per row (every decode step) goes instead to a split-key Triton kernel that reads each
row's keys only up to its own length (`decode_attention`). Any other call (a user's forward on
the same model) goes to transformers' SDPA attention unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

ATTENTION_NAME = "agentrl_slots"


def grouped_query_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float | None
) -> torch.Tensor:
    """Attention of `query` [rows, heads, new, dim] over `keys`/`values` [rows, kv_heads, length, dim].

    `mask` [rows, 1, new, length] is True where a query may attend. Query head h uses key/value
    head h // (heads // kv_heads), as transformers' `repeat_kv` does. Returns [rows, new, heads, dim].
    """
    num_rows, num_heads, num_new, head_dim = query.shape
    num_kv_heads, length = keys.shape[1], keys.shape[2]
    group = num_heads // num_kv_heads
    packed_query = query.reshape(num_rows, num_kv_heads, group * num_new, head_dim)
    # Query row j of a packed head is query head (kv * group + j // new) at token j % new.
    packed_mask = mask[:, :, None].expand(num_rows, 1, group, num_new, length)
    packed_mask = packed_mask.reshape(num_rows, 1, group * num_new, length)
    output = F.scaled_dot_product_attention(packed_query, keys, values, attn_mask=packed_mask, scale=scale)
    return output.reshape(num_rows, num_heads, num_new, head_dim).transpose(1, 2)


def slot_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    slot_forward: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    if slot_forward is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    assert attention_mask is not None and attention_mask.dtype == torch.bool
    if query.is_cuda and query.shape[2] == 1 and slot_forward.write_index is None:
        from agentrl.engine.builtin.kernels.decode_attention import (
            decode_attention,  # Triton: CUDA machines only
        )

        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        lengths = slot_forward.one_token_lengths
        return decode_attention(query[:, :, 0], key, value, lengths, scale)[:, None], None
    return grouped_query_attention(query, key, value, attention_mask, scaling), None


def install_slot_attention(model: PreTrainedModel) -> None:
    """Route `model`'s attention through `slot_attention_forward` (other calls behave as SDPA)."""
    AttentionInterface.register(ATTENTION_NAME, slot_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)
    model.config._attn_implementation = ATTENTION_NAME
