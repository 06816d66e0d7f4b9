"""Inference stage, the engine's own forward pass for Llama-family decoders on CUDA.

Run through transformers' modules, a decoder layer launches about forty kernels; in a decode step
of a small model the GPU spends more time between those launches than in them. This forward pass
reads the same parameters and runs each layer as nine kernels: RMSNorm with the residual add,
one packed q/k/v projection, rotary embedding with the key/value store, attention, the output
projection, RMSNorm with the residual add, one packed gate/up projection, SiLU-and-multiply, and
the down projection (the first layer's RMSNorm comes with the embedding lookup,
`embed_rms_norm`); in a long prefill pass the gate/up projection stores only SiLU(gate) * up
(`prefill_gate_up`), eight kernels. A prefill pass's output and down projections add the
residual in their own epilogue (`added_product`), so the RMSNorm after each reads the sum alone.
In a decode step rotary, the store and attention are one kernel
(`decode_attention.rotate_store_and_attend`): eight a layer, and seven where a step of up to
`decode_linear.MAX_GATE_UP_ROWS` rows runs its gate/up projection with the activation in one
kernel. A decode step of a small model runs its q/k/v and output projections as the engine's own
products (`decode_linear`), so that the kernels on either side start while the one before
drains (`dependent_launch`). Its down projection
(a few rows against a wide input) is a split-K product whose float32 partials the next RMSNorm
sums (`split_k_linear`), where cuBLAS would sum its own splits in a kernel more.
The q/k/v and gate/up weights are packed once into one matrix each, and the model's own
parameters become views of it, so a weight update copied into the model's parameters
(`update_weights`) reaches the packed matrices with no extra step.

Served: the families of `model_setup.FUSED_FAMILIES` (Llama, Mistral, Qwen2, Qwen3) with SiLU MLPs.
Where a family normalises each query and key head before rotary (Qwen3's QK-norm), the kernels that
rotate them normalise them first (`HeadNorms`): no kernel of its own. Rotary embeddings come from
the model's own `rotary_emb` module, so every RoPE variant it supports is applied as it applies it.
Where cos and sin depend on the position alone (every type but dynamic and LongRoPE scaling, which
follow the longest position in the batch), that module runs once for every position of the slot
storage and a pass looks its positions up in the table, in the same kernel as its embedding lookup
(`embed`), where the module launches about nine. Each entry is the value the module gives that
position in any batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel

from agentrl.engine.builtin.cache.slot_cache import SlotKVCache
from agentrl.engine.builtin.kernels.decode_attention import rotate_store_and_attend
from agentrl.engine.builtin.kernels.decode_linear import decode_gate_up_silu, decode_linear, runs_in_triton
from agentrl.engine.builtin.kernels.fused_kernels import HeadNorms, add_rms_norm, embed_rms_norm, rotary_store
from agentrl.engine.builtin.kernels.prefill_attention import prefill_attention
from agentrl.engine.builtin.kernels.prefill_gate_up import gate_up_silu
from agentrl.engine.builtin.model.model_setup import FUSED_FAMILIES, fused_forward_unsupported, pack_linears
from agentrl.engine.builtin.runner.packed_prefill import PackedPrefill
from agentrl.engine.builtin.runner.step_inputs import StepInputs

Attention = Callable[[Tensor, Tensor, Tensor, "PackedLayer", Tensor, Tensor, bool], Tensor]
"""(qkv [tokens, (heads + 2 * kv_heads) * dim], cos, sin [tokens, dim], the layer, its keys, values
[slots, kv_heads, capacity, dim], last layer) -> [tokens, heads, dim]: QK-norm where the layer has
one, rotary, the key/value store and attention; in a prefill pass's last layer, attention of each
row's last token alone."""

DOWN_SPLITS = 4  # partial products of a decode step's down projection
MAX_SPLIT_ROWS = 256  # decode steps of up to this many rows split it (measured faster at 16-256 rows)


def added_product(x: Tensor, linear: torch.nn.Linear, residual: Tensor) -> Tensor:
    """`residual + linear(x)` for `x` [tokens, in_features], the residual added by the product itself.

    cuBLAS adds it in its epilogue and rounds the sum once, where the product would have been
    written out and read back by the next RMSNorm (in a prefill pass, a quarter of that kernel's
    traffic). The sum is written over `residual`, which no caller reads again: an out-of-place
    product would first copy it to its output. A bias, where the model has one, is added after.
    """
    summed = residual.addmm_(x, linear.weight.t())
    if linear.bias is not None:
        summed += linear.bias
    return summed


def split_k_linear(x: torch.Tensor, weight: torch.Tensor, splits: int) -> torch.Tensor:
    """`x @ weight.T` as `splits` float32 partial products [splits, tokens, out_features], for `add_rms_norm`.

    Each split multiplies one slice of the input features: one batched product, whose partials the
    next RMSNorm sums. A few rows against a wide input is where cuBLAS splits the inner dimension
    itself and sums the splits in a kernel of its own; this leaves that sum to a kernel that runs anyway.
    """
    num_tokens, in_features = x.shape
    out_features = weight.shape[0]
    assert in_features % splits == 0 and weight.is_contiguous()
    width = in_features // splits
    inputs = x.view(num_tokens, splits, width).transpose(0, 1)  # [splits, tokens, width]
    weights = weight.view(out_features, splits, width).permute(1, 2, 0)  # [splits, width, out_features]
    return torch.bmm(inputs, weights, out_dtype=torch.float32)


@dataclass(frozen=True)
class PackedLayer:
    """One decoder layer's parameters as the fused forward reads them."""

    input_norm: torch.Tensor  # [hidden]
    qkv_weight: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None
    head_norms: HeadNorms | None  # QK-norm, in families that have it
    output_projection: torch.nn.Linear
    post_norm: torch.Tensor  # [hidden]
    gate_up_weight: torch.Tensor  # [2 * intermediate, hidden]
    gate_up_bias: torch.Tensor | None
    down_projection: torch.nn.Linear


class FusedDecoder:
    """Logits of a forward pass over slot storage, for models `fused_forward_unsupported` accepts."""

    def __init__(self, model: PreTrainedModel) -> None:
        reason = fused_forward_unsupported(model)
        if reason is not None:
            raise ValueError(f"FusedDecoder cannot run {type(model).__name__}: {reason}")
        self.model = model
        decoder = model.get_decoder()
        self.embed_tokens, self.rotary_embedding, self.final_norm = (
            decoder.embed_tokens,
            decoder.rotary_emb,
            decoder.norm,
        )
        attention = decoder.layers[0].self_attn
        self.num_heads = model.config.num_attention_heads
        self.scale = attention.scaling
        self.eps = decoder.norm.variance_epsilon
        qk_norm = FUSED_FAMILIES[model.config.model_type].qk_norm
        self.layers = [self._pack(layer, qk_norm) for layer in decoder.layers]
        rope_type = getattr(self.rotary_embedding, "rope_type", None)
        self.rotary_by_position = isinstance(rope_type, str) and rope_type not in ("dynamic", "longrope")
        self._rotary_table = torch.empty(0)  # [positions, 2, head_dim]: cos and sin of each slot position
        down = decoder.layers[0].mlp.down_proj
        # Half precision only: its products can keep float32 partials; float32 models stay exact as they are.
        self.split_down = (
            down.bias is None
            and down.in_features % DOWN_SPLITS == 0
            and down.weight.dtype in (torch.bfloat16, torch.float16)
        )

    @staticmethod
    def _pack(layer: torch.nn.Module, qk_norm: bool) -> PackedLayer:
        attention, mlp = layer.self_attn, layer.mlp
        qkv_weight, qkv_bias = pack_linears([attention.q_proj, attention.k_proj, attention.v_proj])
        gate_up_weight, gate_up_bias = pack_linears([mlp.gate_proj, mlp.up_proj])
        head_norms = None
        if qk_norm:
            query_norm, key_norm = attention.q_norm, attention.k_norm
            head_norms = HeadNorms(query_norm.weight, key_norm.weight, query_norm.variance_epsilon)
        return PackedLayer(
            layer.input_layernorm.weight, qkv_weight, qkv_bias, head_norms, attention.o_proj,
            layer.post_attention_layernorm.weight, gate_up_weight, gate_up_bias, mlp.down_proj,
        )  # fmt: skip

    def decode(self, inputs: StepInputs, storage: SlotKVCache) -> torch.Tensor:
        """Logits [rows, vocab] of a decode step over slots 0..rows-1 (`step_inputs.decode_inputs`)."""
        assert inputs.write_index is None, "a decode step: one new token per row"
        rows, positions = slice(0, inputs.input_ids.shape[0]), inputs.write_positions
        columns = slice(0, inputs.key_length)  # a graph's: all of the storage (rows read their own keys)
        qkv_in_triton = runs_in_triton(rows.stop, self.layers[0].qkv_weight)  # else cuBLAS ran it

        def attend(
            qkv: Tensor,
            cos: Tensor,
            sin: Tensor,
            layer: PackedLayer,
            keys: Tensor,
            values: Tensor,
            last: bool,
        ) -> Tensor:
            keys, values = keys[rows, :, columns], values[rows, :, columns]
            return rotate_store_and_attend(
                qkv,
                cos,
                sin,
                keys,
                values,
                positions,
                self.scale,
                self.num_heads,
                dependent=qkv_in_triton,
                shared=inputs.shared,
                head_norms=layer.head_norms,
            )

        down_splits = DOWN_SPLITS if self.split_down and rows.stop <= MAX_SPLIT_ROWS else 1
        token_ids = inputs.input_ids.reshape(-1)
        hidden, residual = self._layers(
            token_ids, inputs.write_positions, attend, storage, down_splits, decode=True
        )
        return self._logits(hidden, residual)

    def prefill(self, packed: PackedPrefill, storage: SlotKVCache) -> torch.Tensor:
        """Logits [rows, vocab] of each row's last token; stores every token's key/value (`packed` on the device).

        Only the last tokens' logits are read, so the last layer stops the other tokens once their
        keys and values are stored: its attention, output projection and MLP take a token a row.
        """
        token_ids, slots, positions = packed.per_token
        last_tokens = packed.last_tokens
        # A tile of one token a row (`PackedPrefill.tiles`: slot, first packed token, tokens, first
        # position); none for a padding row whose token is padding (slot -1), as in a graph's capture.
        last_slots = slots[last_tokens]
        last_tiles = torch.stack(
            [last_slots, last_tokens, (last_slots >= 0).long(), positions[last_tokens]], 1
        )

        def attend(
            qkv: Tensor,
            cos: Tensor,
            sin: Tensor,
            layer: PackedLayer,
            keys: Tensor,
            values: Tensor,
            last: bool,
        ) -> Tensor:
            queries = rotary_store(
                qkv, cos, sin, keys, values, slots, positions, self.num_heads, layer.head_norms
            )
            return prefill_attention(queries, keys, values, last_tiles if last else packed.tiles, self.scale)

        hidden, residual = self._layers(
            token_ids, positions, attend, storage, down_splits=1, decode=False, keep=last_tokens
        )
        return self._logits(hidden, residual)

    def _layers(
        self,
        token_ids: Tensor,
        positions: Tensor,
        attend: Attention,
        storage: SlotKVCache,
        down_splits: int,
        decode: bool,
        keep: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """(hidden, residual) after every decoder layer; hidden [tokens, hidden], or the last down
        projection's float32 partials [down_splits, tokens, hidden] when `down_splits` > 1, or None
        in a prefill pass, whose products add the residual themselves (`added_product`).
        `keep`: the tokens the last layer computes past its key/value store (their rows alone are returned).

        A decode step runs its projections but the down projection through `decode_linear`, and
        launches the kernels right after the engine's own kernels dependently (`dependent_launch`).
        """
        normed, residual, cos, sin = self.embed(token_ids, positions, storage.capacity)
        num_tokens = token_ids.shape[0]
        project = functools.partial(decode_linear, dependent=True) if decode else F.linear
        gate_up = functools.partial(decode_gate_up_silu, dependent=True) if decode else gate_up_silu
        output_in_triton = decode and runs_in_triton(num_tokens, self.layers[0].output_projection.weight)
        hidden = None  # the last product, unless it was added to the residual as it was computed
        for index, layer in enumerate(self.layers):
            if index:  # the first layer's input norm came with the embedding
                normed, residual = self._add_norm(hidden, residual, layer.input_norm)
            qkv = project(normed, layer.qkv_weight, layer.qkv_bias)
            last = keep is not None and index == len(self.layers) - 1
            attended = attend(qkv, cos, sin, layer, storage.keys[index], storage.values[index], last)
            if last:
                attended, residual = attended[keep], residual[keep]
            output = layer.output_projection
            if decode:
                hidden = project(attended.flatten(1), output.weight, output.bias)
            else:
                hidden, residual = None, added_product(attended.flatten(1), output, residual)
            normed, residual = self._add_norm(hidden, residual, layer.post_norm, dependent=output_in_triton)
            activated = gate_up(normed, layer.gate_up_weight, layer.gate_up_bias)
            if down_splits > 1:  # summed by the next add_rms_norm
                hidden = split_k_linear(activated, layer.down_projection.weight, down_splits)
            elif decode:
                hidden = layer.down_projection(activated)
            else:
                hidden, residual = None, added_product(activated, layer.down_projection, residual)
        return hidden, residual

    def _add_norm(
        self, hidden: Tensor | None, residual: Tensor, weight: Tensor, dependent: bool = False
    ) -> tuple[Tensor, Tensor]:
        """`add_rms_norm` of `hidden` + `residual`; `hidden` None: the residual already holds the sum."""
        if hidden is None:
            return add_rms_norm(residual, None, weight, self.eps, dependent)
        return add_rms_norm(hidden, residual, weight, self.eps, dependent)

    def embed(
        self, token_ids: Tensor, positions: Tensor, capacity: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(first layer's normed input, residual, cos, sin) of the tokens at `positions` (each below `capacity`).

        cos and sin [tokens, head_dim] are the model's rotary embedding in its dtype: looked up in
        `rotary_table` along with the embedding, or, where they follow the pass's longest position,
        computed by the model's module for this pass.
        """
        first_norm = self.layers[0].input_norm
        if not self.rotary_by_position:
            hidden = self.embed_tokens(token_ids)
            normed, residual = add_rms_norm(hidden, None, first_norm, self.eps)
            cos, sin = self.rotary_embedding(hidden, positions[None])
            return normed, residual, cos[0], sin[0]
        table = self.rotary_table(capacity, self.embed_tokens.weight)
        normed, residual, both = embed_rms_norm(
            token_ids, positions, self.embed_tokens.weight, first_norm, self.eps, table
        )
        return normed, residual, both[:, 0], both[:, 1]

    def rotary_table(self, capacity: int, like: Tensor) -> Tensor:
        """[positions, 2, head_dim]: cos and sin of every position below `capacity` at least, in `like`'s dtype."""
        if self._rotary_table.shape[0] < capacity:  # a pass before any graph capture at this capacity
            every = torch.arange(capacity, device=like.device)
            cos, sin = self.rotary_embedding(like, every[None])
            self._rotary_table = torch.stack([cos[0], sin[0]], dim=1)
        return self._rotary_table

    def _logits(self, hidden: Tensor | None, residual: Tensor) -> Tensor:
        normed, _ = self._add_norm(hidden, residual, self.final_norm.weight)
        return self.model.lm_head(normed)
