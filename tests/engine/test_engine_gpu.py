"""The built-in engine on one CUDA device: float32 exactness and a Qwen2.5-0.5B-shaped bf16 model."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from agentrl.engine import FinishReason, SamplingParams, TransformersEngine
from agentrl.engine.builtin.engine import CUDA_DECODE_LOOKAHEAD
from agentrl.engine.builtin.runner.decode_graphs import row_buckets
from agentrl.engine.config import EngineConfig
from tests.engine.conftest import VOCAB_SIZE, tiny_qwen2
from tests.engine.test_transformers_engine import (
    MIXED,
    PROMPTS,
    assert_same_generations,
    full_forward_logprobs,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def qwen2_5_0_5b_shaped(dtype: torch.dtype) -> Qwen2ForCausalLM:
    """Qwen2.5-0.5B's shape with random weights, initialised wide enough for peaked distributions."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.1,
    )  # fmt: skip
    with torch.device("cuda"):
        return Qwen2ForCausalLM(config).to(dtype).eval()


def qwen3_0_6b_shaped(dtype: torch.dtype) -> Qwen3ForCausalLM:
    """Qwen3-0.6B's shape: QK-norm, 16 heads of 128 (2,048 features from a hidden size of 1,024)."""
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.1,
    )  # fmt: skip
    with torch.device("cuda"):
        return Qwen3ForCausalLM(config).to(dtype).eval()


SHAPED = [qwen2_5_0_5b_shaped, qwen3_0_6b_shaped]


async def test_on_gpu_float32_logprobs_equal_a_full_forward_pass():
    model = tiny_qwen2()
    params = SamplingParams(max_new_tokens=10, temperature=0.7, seed=3)
    async with TransformersEngine(model, [], EngineConfig(device="cuda")) as engine:
        generations = await asyncio.gather(*[engine.generate(p, params) for p in PROMPTS])
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        expected = full_forward_logprobs(model, prompt, generation, temperature=0.7)
        assert generation.logprobs == pytest.approx(expected, abs=1e-4)


async def test_on_gpu_requests_joining_mid_flight_get_the_same_tokens_as_alone():
    model = tiny_qwen2()
    async with TransformersEngine(model, [], EngineConfig(device="cuda", max_prefill_tokens=1)) as engine:
        batched = await asyncio.gather(*[engine.generate(p, s) for p, s in zip(PROMPTS, MIXED, strict=True)])
    async with TransformersEngine(model, [], EngineConfig(device="cuda")) as engine:
        alone = [await engine.generate(p, s) for p, s in zip(PROMPTS, MIXED, strict=True)]
    assert_same_generations(batched, alone)


async def sampled_logprob_errors(model: PreTrainedModel) -> list[float]:
    """|engine logprob - full-forward logprob| over 16 concurrent sampled requests of varied length."""
    prompts = [[(7 * i + 13 * j) % 151936 for j in range(20 + 11 * i)] for i in range(16)]
    params = [
        SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.95, top_k=50, seed=i) for i in range(16)
    ]
    async with TransformersEngine(model, [], EngineConfig(device="cuda", max_prefill_tokens=2048)) as engine:
        assert engine.runner.fused_decoder is not None  # every shaped model here runs the fused forward
        generations = await asyncio.gather(
            *[engine.generate(p, s) for p, s in zip(prompts, params, strict=True)]
        )
    errors = []
    for prompt, generation in zip(prompts, generations, strict=True):
        assert (len(generation.completion_ids), generation.finish_reason) == (24, FinishReason.LENGTH)
        expected = full_forward_logprobs(model, prompt, generation, temperature=1.0)
        errors += [abs(a - b) for a, b in zip(generation.logprobs, expected, strict=True)]
    print(
        f"{model.dtype} |engine - full forward| logprob: mean {sum(errors) / len(errors):.2e} max {max(errors):.2e}"
    )
    return errors


@pytest.mark.parametrize("make_model", SHAPED)
async def test_a_real_shaped_float32_model_matches_a_full_forward_pass(make_model):
    errors = await sampled_logprob_errors(make_model(torch.float32))
    assert max(errors) < 1e-3


@pytest.mark.parametrize("make_model", SHAPED)
async def test_a_real_shaped_bf16_model_stays_within_bf16_rounding_of_a_full_forward_pass(make_model):
    errors = await sampled_logprob_errors(make_model(torch.bfloat16))
    assert all(math.isfinite(e) for e in errors)
    # Measured: bf16 rounding alone gives a mean of about 0.12 nats (CPU and H200 alike), while
    # reading logits one position off gives about 3 nats; a cache or position bug lands far above 0.5.
    assert sum(errors) / len(errors) < 0.5


async def test_on_gpu_cuda_graph_decoding_equals_eager_decoding():
    model = tiny_qwen2(max_position_embeddings=512)
    params = [SamplingParams(max_new_tokens=300 if i == 0 else 20, temperature=1.0, seed=i) for i in range(4)]
    results = []
    for graphs in (True, False):
        async with TransformersEngine(model, [], EngineConfig(device="cuda", cuda_graphs=graphs)) as engine:
            results.append(
                await asyncio.gather(*[engine.generate(p, s) for p, s in zip(PROMPTS, params, strict=True)])
            )
            if graphs:
                num_graphs = engine.runner.decode_graphs.num_graphs
                num_blocks = engine.runner.decode_graphs.num_blocks
    assert_same_generations(results[0], results[1])
    # Slots last grew at position 256, which dropped the graphs; the next step captured one per row
    # bucket up to the engine's 64 rows and staged block (one more than the steps launched ahead),
    # and no other step captured anything.
    assert num_blocks == CUDA_DECODE_LOOKAHEAD + 1
    assert num_graphs == num_blocks * len(row_buckets(64)) == num_blocks * 7


async def test_on_gpu_prefix_cache_hits_sample_what_cold_prefill_samples():
    """Followers copy the leader's prompt blocks and, at decode, read them from its slot."""
    model = tiny_qwen2(max_position_embeddings=512)
    prompt = [(7 * i) % VOCAB_SIZE for i in range(150)]
    params = [SamplingParams(max_new_tokens=12, temperature=1.0, seed=i) for i in range(4)]
    runs, staged = {}, []
    for budget in (1 << 24, 0):
        async with TransformersEngine(
            model, [], EngineConfig(device="cuda", prefix_cache_bytes=budget)
        ) as engine:
            stage = engine.runner.stage_decode

            def recording_stage(*args, stage=stage):
                staged.append(args[-1])
                return stage(*args)

            engine.runner.stage_decode = recording_stage
            runs[budget] = await asyncio.gather(*[engine.generate(prompt, s) for s in params])
            cached = engine.stats.num_prefix_cached_tokens
        if budget:
            assert cached == 3 * 144  # three followers reuse nine blocks of 16
            assert staged[0] == ([0, 0, 0, 0], [0, 144, 144, 144])
    assert staged[-1] is None  # no prefix cache, no sharing
    assert_same_generations(runs[1 << 24], runs[0])


async def test_on_gpu_a_bf16_state_dict_on_the_device_is_copied_in_place():
    model = qwen2_5_0_5b_shaped(torch.bfloat16)
    # named_parameters lists the tied embedding/output matrix once.
    state_dict = {name: torch.randn_like(t) for name, t in model.named_parameters()}
    async with TransformersEngine(model, [], EngineConfig(device="cuda")) as engine:
        pointers = {name: t.data_ptr() for name, t in model.state_dict().items()}
        await engine.update_weights(state_dict, version=1)
        print(
            f"in-place weight copy of the 0.5B shape (bf16, on device): {engine.stats.weight_sync_seconds * 1e3:.1f} ms"
        )
    assert all(torch.equal(model.state_dict()[name], t) for name, t in state_dict.items())
    assert {name: t.data_ptr() for name, t in model.state_dict().items()} == pointers


async def test_a_closed_engine_frees_its_device_memory_once_dropped_without_a_cycle_collection():
    """Captured graphs call back into the runner; closing the engine breaks that cycle, so its slot
    storage and graph memory are freed as soon as the engine is dropped."""
    import gc
    import weakref

    gc.disable()
    try:
        async with TransformersEngine(
            tiny_qwen2(), [], EngineConfig(device="cuda"), dtype=torch.bfloat16
        ) as engine:
            await asyncio.gather(*[engine.generate(p, s) for p, s in zip(PROMPTS, MIXED, strict=True)])
            assert engine.runner.decode_graphs.num_graphs > 0 and engine.runner.prefill_graphs is not None
            runner, storage = weakref.ref(engine.runner), weakref.ref(engine.runner.slots.keys)
        del engine
        assert runner() is None and storage() is None
    finally:
        gc.enable()
