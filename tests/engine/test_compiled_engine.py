"""The engine with compiled decoder-layer parts generates what the eager engine generates."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl.compiled_layers import compile_decoder_layers
from agentrl.engine import TransformersEngine
from tests.engine.conftest import on_cpu, tiny_qwen2
from tests.engine.test_transformers_engine import MIXED, PROMPTS


async def generations(torch_compile: bool):
    async with TransformersEngine(tiny_qwen2(), [], on_cpu(torch_compile=torch_compile)) as engine:
        return await asyncio.gather(*[engine.generate(p, s) for p, s in zip(PROMPTS, MIXED, strict=True)])


@pytest.mark.slow
async def test_a_compiled_engine_samples_the_eager_engines_tokens_and_logprobs():
    eager = await generations(torch_compile=False)
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = await generations(torch_compile=True)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs_before  # it did compile
    for got, expected in zip(compiled, eager, strict=True):
        assert got.completion_ids == expected.completion_ids
        assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-5)


def test_compiling_a_model_twice_compiles_each_part_once():
    model = tiny_qwen2()
    compile_decoder_layers(model)
    compiled_once = model.model.layers[0].mlp.forward
    compile_decoder_layers(model)
    assert model.model.layers[0].mlp.forward is compiled_once
    assert compiled_once._torchdynamo_orig_callable is not None


def test_a_model_without_decoder_layer_classes_is_rejected_by_name():
    model = tiny_qwen2()
    model._no_split_modules = []
    with pytest.raises(ValueError, match="Qwen2ForCausalLM names no decoder layer class"):
        compile_decoder_layers(model)
