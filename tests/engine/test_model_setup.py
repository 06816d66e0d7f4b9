"""What the engine does to a model before serving it: packing projections, choosing the fused forward."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Qwen3MoeConfig, Qwen3MoeForCausalLM

from agentrl.engine import TransformersEngine
from agentrl.engine.builtin.model.model_setup import fused_forward_unsupported, pack_linears
from agentrl.engine.builtin.runner.model_runner import cache_keyword
from tests.engine.conftest import on_cpu, tiny_llama, tiny_mistral, tiny_qwen2, tiny_qwen3


def test_packed_projections_keep_their_values_and_share_the_packed_storage():
    attention = tiny_qwen2().model.layers[0].self_attn
    linears = [attention.q_proj, attention.k_proj, attention.v_proj]
    before = [(linear.weight.detach().clone(), linear.bias.detach().clone()) for linear in linears]
    weight, bias = pack_linears(linears)
    assert weight.shape == (32 + 16 + 16, 32) and bias.shape == (64,)  # 4 query heads, 2 key/value heads of 8
    for linear, (old_weight, old_bias) in zip(linears, before, strict=True):
        assert torch.equal(linear.weight, old_weight) and torch.equal(linear.bias, old_bias)
    assert torch.equal(weight, torch.cat([w for w, _ in before])) and torch.equal(
        bias, torch.cat([b for _, b in before])
    )
    # An in-place copy into a parameter (what update_weights does) lands in the packed matrix.
    attention.k_proj.weight.copy_(torch.full((16, 32), 7.0))
    attention.v_proj.bias.copy_(torch.arange(16.0))
    assert torch.equal(weight[32:48], torch.full((16, 32), 7.0)) and torch.equal(
        bias[48:], torch.arange(16.0)
    )


def test_packing_projections_without_biases_packs_no_bias():
    mlp = tiny_llama().model.layers[0].mlp
    weight, bias = pack_linears([mlp.gate_proj, mlp.up_proj])
    assert weight.shape == (128, 32) and bias is None
    assert mlp.gate_proj.weight.data_ptr() == weight.data_ptr()


def test_the_fused_forward_serves_the_llama_like_families_and_names_why_it_skips_others():
    for make_model in (tiny_qwen2, tiny_llama, tiny_qwen3, tiny_mistral):
        assert fused_forward_unsupported(make_model()) is None
    served = "['llama', 'mistral', 'qwen2', 'qwen3']"
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    assert fused_forward_unsupported(gpt2) == f"model_type 'gpt2' is not one of {served}"
    # Qwen3's attention with expert MLPs, which the fused kernels do not compute.
    moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, moe_intermediate_size=16, num_experts=2,
        num_experts_per_tok=1, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
    ))  # fmt: skip
    assert fused_forward_unsupported(moe) == f"model_type 'qwen3_moe' is not one of {served}"


def test_a_mistral_sliding_window_is_served_only_where_it_covers_every_position():
    # max_position_embeddings is 128: a window of 128 keys reaches back to position 0 from any query.
    for window in (None, 128, 4096):
        asyncio.run(TransformersEngine(tiny_mistral(sliding_window=window), [], on_cpu()).close())
    with pytest.raises(ValueError, match=r"sliding_window=127\); .*sliding_window to null"):
        TransformersEngine(tiny_mistral(sliding_window=127), [], on_cpu())
    engine = TransformersEngine(tiny_mistral(sliding_window=64), [], on_cpu(), max_context_len=64)
    asyncio.run(engine.close())


def test_the_slots_go_in_by_the_cache_keyword_the_models_forward_takes():
    class Renamed(torch.nn.Module):  # transformers 5.24 and later
        def forward(self, input_ids, cache=None, **kwargs): ...

    class Older(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None, **kwargs): ...

    class Neither(torch.nn.Module):
        def forward(self, input_ids, **kwargs): ...

    assert cache_keyword(Renamed()) == "cache"
    assert cache_keyword(Older()) == "past_key_values"
    with pytest.raises(ValueError, match="neither `cache` nor `past_key_values`.*engine.backend=sglang"):
        cache_keyword(Neither())
