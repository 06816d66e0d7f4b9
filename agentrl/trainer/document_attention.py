"""Training stage, model side: causal attention over packed sequences, one document at a time.

A packed micro-batch is one row of concatenated sequences ("documents") whose position ids
restart at 0 for each. Attention must stay inside each document. transformers' stock
attention would express that as a dense [N, N] mask (4 GiB of booleans for 64k tokens) and
compute every off-diagonal block only to mask it out; here each document gets its own causal
scaled-dot-product attention, which runs on the flash kernel on CUDA and reads grouped K/V
heads without expanding them. cuDNN's attention, SDPA's first choice on Hopper GPUs, is left out:
it builds a plan for every new sequence length, and on batches of varied lengths (as rollouts
are) that set-up made a 0.5B update about 4x slower than flash attention. No token attends across a document boundary, and no work is
spent on padding or on masked-out blocks.

The document lengths travel as a host (CPU) tensor through the model's keyword arguments
(transformers passes unknown ones down to the attention function), so splitting needs no
device-to-host copy. Compiled decoder layers do not trace it (`torch.compiler.disable`): traced,
the loop would be unrolled over the lengths and recompiled for every new set of them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface

DOCUMENT_ATTENTION = "agentrl_document_causal"
# Every backend but cuDNN's (see the module doc), in SDPA's order of preference.
BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@torch.compiler.disable
def document_causal_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, num_heads, N, head_dim]
    key: torch.Tensor,  # [1, num_kv_heads, N, head_dim]
    value: torch.Tensor,  # [1, num_kv_heads, N, head_dim]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    document_lengths: torch.Tensor | None = None,  # [D] int64 on the host
    **kwargs: object,
) -> tuple[torch.Tensor, None]:  # [1, N, num_heads, head_dim]
    """transformers attention function: causal attention within each packed document."""
    lengths = None if document_lengths is None else document_lengths.tolist()
    if lengths is None or query.shape[0] != 1 or sum(lengths) != query.shape[2]:
        raise ValueError(
            f"{DOCUMENT_ATTENTION} needs one packed row and document_lengths summing to its length; "
            f"got query {tuple(query.shape)} and document_lengths {lengths}"
        )
    if sliding_window is not None or dropout != 0.0:
        raise ValueError(
            f"{DOCUMENT_ATTENTION} supports full causal attention without dropout; got "
            f"sliding_window={sliding_window}, dropout={dropout}: set actor.sequence_packing=false"
        )
    # split, not slicing: its backward writes each document's gradient into one tensor, where
    # slices would each add a zero-filled full-length gradient.
    with sdpa_kernel(BACKENDS):
        outputs = [
            F.scaled_dot_product_attention(
                doc_query,
                doc_key,
                doc_value,
                is_causal=True,
                scale=scaling,
                enable_gqa=key.shape[1] != query.shape[1],
            )
            for doc_query, doc_key, doc_value in zip(
                query.split(lengths, dim=2),
                key.split(lengths, dim=2),
                value.split(lengths, dim=2),
                strict=True,
            )
        ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def register_document_attention() -> str:
    """Make DOCUMENT_ATTENTION a valid `attn_implementation` for transformers models; returns the name."""
    AttentionInterface.register(DOCUMENT_ATTENTION, document_causal_attention)
    return DOCUMENT_ATTENTION
