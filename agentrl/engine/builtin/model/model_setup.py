"""Inference stage: checks and settings the built-in engine applies to a model before serving it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import PreTrainedModel


def attention_backends(device: torch.device) -> contextlib.AbstractContextManager:
    """Keep SDPA off its cuDNN backend on CUDA while the engine runs a forward pass.

    With a padding mask SDPA picks cuDNN, which builds a graph per new key length, and the key
    length grows at every decode step: measured, a decode step through masked cuDNN SDPA took far
    longer than through eager attention with the same mask. The flag is process-wide while the
    context is open; every backend computes the same attention.
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def check_full_attention(model: PreTrainedModel, max_context_len: int) -> None:
    """Slots keep every position of every layer, which sliding-window layers would not attend to.

    A window of at least `max_context_len` positions covers every key a query can have, so such a
    layer attends as a full-attention one. A config with a window and no `layer_types` (Mistral's)
    applies the window to every layer.
    """
    config = model.config
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if not layer_types:
        layer_types = ["sliding_attention" if window is not None else "full_attention"]
    other = set(layer_types) - {"full_attention"}
    if window is not None and window >= max_context_len:
        other.discard("sliding_attention")
    if other:
        raise ValueError(
            f"model has {sorted(other)} attention layers (sliding_window={window}); TransformersEngine serves "
            f"full-attention models only: set the config's sliding_window to null (for Qwen2 and Qwen3, "
            f"use_sliding_window=False), or serve at most {window} positions (TransformersEngine's max_context_len)"
        )


@dataclass(frozen=True)
class FusedFamily:
    """What one model family's decoder layer does beyond Llama's, within what `fused_decoder` computes."""

    qk_norm: bool  # an RMSNorm over each query and key head before rotary (`q_norm`, `k_norm`)


# Every family here is Llama's layer (pre-norm, rotary on halves, gated SiLU MLP). Biases and an
# explicit head_dim (num_heads * head_dim != hidden_size) are read from the model itself.
# Not here: GLM-4 (norms after attention and MLP, rotary on interleaved pairs of half the head),
# Gemma (norm weights offset by one, GELU), and MoE models (gpt-oss, DeepSeek-V3, Qwen3-MoE),
# whose expert MLPs the fused kernels do not compute: they run through transformers' modules.
FUSED_FAMILIES: dict[str, FusedFamily] = {
    "llama": FusedFamily(qk_norm=False),
    "mistral": FusedFamily(qk_norm=False),
    "qwen2": FusedFamily(qk_norm=False),
    "qwen3": FusedFamily(qk_norm=True),
}


def fused_forward_unsupported(model: PreTrainedModel) -> str | None:
    """Why the engine's fused forward (`fused_decoder`) cannot run `model`, or None when it can."""
    config = model.config
    if config.model_type not in FUSED_FAMILIES:
        return f"model_type {config.model_type!r} is not one of {sorted(FUSED_FAMILIES)}"
    if getattr(config, "hidden_act", None) != "silu":
        return f"hidden_act {getattr(config, 'hidden_act', None)!r} is not 'silu'"
    return None


def pack_linears(linears: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) stacking the outputs of `linears`; their parameters become views of it."""
    weight = torch.cat([linear.weight.detach() for linear in linears])
    has_bias = any(linear.bias is not None for linear in linears)
    bias = None
    if has_bias:
        bias = torch.cat([
            linear.bias.detach() if linear.bias is not None else weight.new_zeros(linear.out_features)
            for linear in linears
        ])  # fmt: skip
    start = 0
    for linear in linears:
        end = start + linear.out_features
        linear.weight = torch.nn.Parameter(weight[start:end], requires_grad=False)
        if linear.bias is not None:
            linear.bias = torch.nn.Parameter(bias[start:end], requires_grad=False)
        start = end
    return weight, bias


def slot_shape(model: PreTrainedModel) -> dict[str, int]:
    """Layer count and key/value head shape, as `SlotKVCache` takes them."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return {"num_layers": config.num_hidden_layers, "num_kv_heads": num_kv_heads, "head_dim": head_dim}


_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; use one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def validate_state_dict(
    state_dict: dict[str, torch.Tensor], param_shapes: dict[str, tuple[int, ...]]
) -> None:
    """Raise ValueError for names the model does not have or shapes that differ from it."""
    unknown = sorted(set(state_dict) - set(param_shapes))
    if unknown:
        raise ValueError(
            f"state_dict has {len(unknown)} names the model lacks, e.g. {unknown[:3]}; "
            f"expected names like {sorted(param_shapes)[:3]} (a plain, unwrapped HF state dict)"
        )
    for name, tensor in state_dict.items():
        if tuple(tensor.shape) != param_shapes[name]:
            raise ValueError(
                f"state_dict[{name!r}] has shape {tuple(tensor.shape)}, the model's is {param_shapes[name]}"
            )


def eos_ids(model: PreTrainedModel, tokenizer_or_eos_ids: Any) -> frozenset[int]:
    if not hasattr(tokenizer_or_eos_ids, "eos_token_id"):
        ids = list(tokenizer_or_eos_ids)
        if not all(isinstance(i, int) for i in ids):
            raise ValueError(f"eos ids {ids!r} must all be ints (or pass the tokenizer itself)")
        return frozenset(ids)
    ids = {tokenizer_or_eos_ids.eos_token_id}
    generation_config = getattr(model, "generation_config", None)
    config_eos = getattr(generation_config, "eos_token_id", None)
    ids.update(config_eos if isinstance(config_eos, list) else [config_eos])
    return frozenset(i for i in ids if i is not None)
