"""Tiny random causal LMs and a word-level tokenizer, built in memory for engine tests."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from agentrl.engine.config import EngineConfig

VOCAB_SIZE = 64


def on_cpu(**knobs) -> EngineConfig:
    """The engine section with `knobs` set, on the CPU whatever the machine has: the passes these
    tests expect (no CUDA graphs, no decode lookahead, transformers' modules) are the CPU's."""
    return EngineConfig(device="cpu", **knobs)


def tiny_qwen2(seed: int = 0, max_position_embeddings: int = 128) -> PreTrainedModel:
    """Two layers, grouped-query attention; a wide init so that distributions are peaked."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        initializer_range=0.3,
    )
    return Qwen2ForCausalLM(config).eval()


def tiny_llama(seed: int = 0) -> PreTrainedModel:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        initializer_range=0.3,
    )
    return LlamaForCausalLM(config).eval()


def tiny_qwen3(seed: int = 0) -> PreTrainedModel:
    """QK-norm, and an explicit head_dim: 4 heads of 16 make 64 features against a hidden size of 32."""
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        initializer_range=0.3,
    )
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # norm weights start at one: make the query's and key's differ
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.normal_(1.0, 0.5)
            layer.self_attn.k_norm.weight.normal_(1.0, 0.5)
    return model


def tiny_mistral(seed: int = 0, sliding_window: int | None = None) -> PreTrainedModel:
    torch.manual_seed(seed)
    config = MistralConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        sliding_window=sliding_window,
        initializer_range=0.3,
    )
    return MistralForCausalLM(config).eval()


def word_tokenizer(eos_token_id: int) -> PreTrainedTokenizerFast:
    """A real fast tokenizer over words t0..t63 whose EOS is t<eos_token_id>."""
    vocab = {f"t{i}": i for i in range(VOCAB_SIZE)}
    backend = Tokenizer(WordLevel(vocab, unk_token="t0"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=f"t{eos_token_id}", unk_token="t0")


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # The CI machine has two cores shared by every test process.
    torch.set_num_threads(1)


@pytest.fixture(params=["qwen2", "llama"])
def any_tiny_model(request: pytest.FixtureRequest) -> PreTrainedModel:
    return tiny_qwen2() if request.param == "qwen2" else tiny_llama()
