"""Training stage, model side: causal attention over packed sequences, each confined to its own.

A packed micro-batch is one row of concatenated sequences ("documents") whose position ids
restart at 0 for each. Attention must stay inside each document. transformers' stock
attention would express that as a dense [N, N] mask (4 GiB of booleans for 64k tokens) and
compute every off-diagonal block only to mask it out. Here no token attends across a document
boundary, and no work is spent on padding or on masked-out blocks:

- On CUDA in bf16/fp16 (Ampere or newer), one variable-length flash-attention call covers the
  whole row: the kernel takes the documents' offsets and reads grouped K/V heads in place. At a
  0.5B layer's shapes (8 x 4,096 tokens, 14 query and 2 K/V heads of 64) that took 3.5 ms forward
  and backward on an H100, against 5.0 ms for a call per document and the concatenation after.
- Elsewhere (CPU, float32), each document gets its own causal scaled-dot-product attention.

cuDNN's attention, SDPA's first choice on Hopper GPUs, is never used: it builds a plan for every
new sequence length, and on batches of varied lengths (as rollouts are) that set-up made a 0.5B
update about 4x slower than flash attention.

The document lengths travel as a host (CPU) tensor through the model's keyword arguments
(transformers passes unknown ones down to the attention function), so splitting needs no
device-to-host copy. Compiled decoder layers do not trace the attention
(`torch.compiler.disable`): it depends on those host values, and traced it would recompile for
every new set of them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface

DOCUMENT_ATTENTION = "agentrl_document_causal"
# Every backend but cuDNN's (see the module doc), in SDPA's order of preference.
BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
FLASH_DTYPES = (torch.float16, torch.bfloat16)


class VarlenFlashAttention(torch.autograd.Function):
    """Causal flash attention over packed documents: [N, heads, D] queries, [N, kv heads, D] keys/values."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        offsets: torch.Tensor,  # [D + 1] int32 on the device: where each document starts, then N
        max_length: int,
        scale: float | None,
    ) -> torch.Tensor:  # [N, heads, D]
        output, logsumexp, rng_state, unused, _ = torch.ops.aten._flash_attention_forward(
            query, key, value, offsets, offsets, max_length, max_length, 0.0, True, False, scale=scale
        )
        ctx.save_for_backward(query, key, value, output, logsumexp, offsets, rng_state, unused)
        ctx.max_length, ctx.scale = max_length, scale
        return output

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        query, key, value, output, logsumexp, offsets, rng_state, unused = ctx.saved_tensors
        grad_query, grad_key, grad_value = torch.ops.aten._flash_attention_backward(
            grad_output.contiguous(), query, key, value, output, logsumexp, offsets, offsets,
            ctx.max_length, ctx.max_length, 0.0, True, rng_state, unused, scale=ctx.scale,
        )  # fmt: skip
        return grad_query, grad_key, grad_value, None, None, None


def runs_varlen_flash(query: torch.Tensor) -> bool:
    """Whether packed attention on `query` ([1, heads, N, D]) takes the variable-length flash kernel."""
    return (
        query.is_cuda
        and query.dtype in FLASH_DTYPES
        and query.shape[-1] % 8 == 0
        and query.shape[-1] <= 256
        and torch.cuda.get_device_capability(query.device) >= (8, 0)
    )


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
    if runs_varlen_flash(query):
        offsets = F.pad(document_lengths.cumsum(0), (1, 0)).to(query.device, torch.int32)
        output = VarlenFlashAttention.apply(
            query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
            offsets, max(lengths), scaling,
        )  # fmt: skip
        return output[None], None
    return per_document_attention(query, key, value, lengths, scaling), None


def per_document_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lengths: list[int], scaling: float | None
) -> torch.Tensor:  # [1, N, num_heads, head_dim]
    """Causal scaled-dot-product attention on each document's slice of the packed row."""
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
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous()


def register_document_attention() -> str:
    """Make DOCUMENT_ATTENTION a valid `attn_implementation` for transformers models; returns the name."""
    AttentionInterface.register(DOCUMENT_ATTENTION, document_causal_attention)
    return DOCUMENT_ATTENTION
