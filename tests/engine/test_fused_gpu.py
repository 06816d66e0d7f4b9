"""The engine's fused forward and Triton sampler against transformers' modules and torch sampling, on CUDA."""

from __future__ import annotations

import asyncio

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen2ForCausalLM

from agentrl.engine import SamplingParams, TransformersEngine
from agentrl.engine.builtin.runner.decode_batch import DecodeBatch, DecodeInputs
from agentrl.engine.builtin.runner.packed_prefill import PackedPrefill
from agentrl.engine.builtin.runner.sampling import inverse_cdf_sample
from agentrl.engine.builtin.runner.step_inputs import PrefillRows
from agentrl.engine.config import EngineConfig
from tests.engine.conftest import VOCAB_SIZE, tiny_llama, tiny_mistral, tiny_qwen2, tiny_qwen3
from tests.engine.test_transformers_engine import PROMPTS, assert_same_generations

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


async def generate_all(model, params, **knobs):
    async with TransformersEngine(model, [], EngineConfig(device="cuda", **knobs)) as engine:
        first = await asyncio.gather(*[engine.generate(p, s) for p, s in zip(PROMPTS, params, strict=True)])
        # Second round: the prompts' prefixes now come from the prefix cache.
        second = await asyncio.gather(*[engine.generate(p, s) for p, s in zip(PROMPTS, params, strict=True)])
        assert (engine.runner.fused_decoder is not None) == engine.config.fused_forward
    return first + second


@pytest.mark.parametrize("make_model", [tiny_qwen2, tiny_llama, tiny_qwen3, tiny_mistral])
async def test_the_fused_forward_samples_what_transformers_modules_sample_in_float32(make_model):
    params = [SamplingParams(max_new_tokens=30, temperature=1.0, seed=i) for i in range(len(PROMPTS))]
    fused = await generate_all(make_model(), params)
    modules = await generate_all(make_model(), params, fused_forward=False)
    assert_same_generations(fused, modules)


@pytest.mark.parametrize("make_model", [tiny_qwen2, tiny_qwen3])  # Qwen3's: its QK-norm weights too
async def test_a_weight_update_reaches_the_packed_projections(make_model):
    params = [SamplingParams(max_new_tokens=20, temperature=1.0, seed=i) for i in range(len(PROMPTS))]
    expected = await generate_all(make_model(seed=1), params)
    async with TransformersEngine(make_model(seed=0), [], EngineConfig(device="cuda")) as engine:
        await engine.update_weights(
            {k: v.cuda() for k, v in make_model(seed=1).state_dict().items()}, version=1
        )
        got = await asyncio.gather(*[engine.generate(p, s) for p, s in zip(PROMPTS, params, strict=True)])
    assert_same_generations(got, expected[: len(PROMPTS)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_sampler_draws_the_torch_samplers_tokens(dtype):
    from agentrl.engine.builtin.kernels.fused_sampling import sample_with_temperature

    generator = torch.Generator(device="cuda").manual_seed(0)
    num_rows, vocab = 64, 151936
    logits = (4 * torch.randn((num_rows, vocab), generator=generator, device="cuda")).to(dtype)
    temperatures = torch.tensor([0.0, 0.6, 1.0, 1.7] * (num_rows // 4), device="cuda")
    uniforms = torch.rand(num_rows, generator=generator, device="cuda", dtype=torch.float64)
    buffer = torch.full((num_rows + 8,), -1, dtype=torch.int64, device="cuda")
    token_ids, picked = sample_with_temperature(logits, temperatures, uniforms, buffer[4 : 4 + num_rows])
    scaled = logits.float() / torch.where(temperatures == 0, 1.0, temperatures)[:, None]
    log_normalizers = scaled.logsumexp(-1, keepdim=True)
    expected = inverse_cdf_sample((scaled - log_normalizers).exp(), uniforms)
    expected = torch.where(temperatures == 0, scaled.argmax(-1), expected)
    assert token_ids.tolist() == expected.tolist() == picked[0].long().tolist()
    assert buffer.tolist() == [-1] * 4 + expected.tolist() + [-1] * 4  # written in place, nothing around it
    expected_logprobs = (scaled.gather(-1, expected[:, None]) - log_normalizers).squeeze(-1)
    assert picked.dtype == torch.float64
    torch.testing.assert_close(picked[1], expected_logprobs.double(), atol=1e-5, rtol=0)
    # Into entry 2 of a pinned host buffer instead: the same picks, nothing else written.
    host = torch.full((4, 2, num_rows + 8), -1.0, dtype=torch.float64, pin_memory=True)
    entries = torch.full((num_rows,), 2, dtype=torch.int64, device="cuda")
    _, none = sample_with_temperature(logits, temperatures, uniforms, pick_buffer=(host, entries))
    torch.cuda.synchronize()
    assert none is None and torch.equal(host[2, :, :num_rows], picked.cpu())
    assert (host[2, :, num_rows:] == -1).all() and (host[[0, 1, 3]] == -1).all()


def test_a_staged_block_unpacks_on_cuda_as_on_the_host():
    rows = 300  # more columns than one program takes
    params = [
        SamplingParams(max_new_tokens=4, temperature=[0.0, 0.7, 1.0][i % 3], top_k=[-1, 5][i % 2], top_p=0.9)
        for i in range(rows)
    ]
    positions = [(7 * i) % 500 for i in range(rows)]
    sources = [i % 11 - 1 for i in range(rows)]  # -1: the host's id
    host_ids = [1000 + i for i in range(rows)]
    uniforms = [i / rows for i in range(rows)]
    batch = DecodeBatch.stage(
        positions, sources, host_ids, params, uniforms, columns=320, pin=True, pick_entry=3
    )
    samples = torch.arange(500, 520)
    on_host = DecodeInputs.unpack(batch.staged, params, samples)
    # The kernel reads a block on the device, or in place in pinned host memory (a captured step's).
    for block in (batch.staged.cuda(), batch.staged):
        on_cuda = DecodeInputs.unpack(block, params, samples.cuda())
        for field in ("input_ids", "positions", "slots", "pick_entries"):
            got, expected = getattr(on_cuda, field), getattr(on_host, field)
            assert got.is_cuda and got.dtype == expected.dtype and torch.equal(got.cpu(), expected), field
        for field in ("temperatures", "top_ks", "top_ps", "uniforms"):
            got, expected = getattr(on_cuda.sampling, field), getattr(on_host.sampling, field)
            assert got.is_cuda and got.dtype == expected.dtype and torch.equal(got.cpu(), expected), field
        assert on_cuda.sampling.filters and not on_cuda.sampling.all_greedy


@pytest.mark.parametrize("make_model", [tiny_qwen2, tiny_llama, tiny_qwen3])
def test_the_embedding_lookup_normalises_the_first_layers_input_as_the_norm_kernel_does(make_model):
    from agentrl.engine.builtin.kernels.fused_kernels import add_rms_norm, embed_rms_norm
    from agentrl.engine.builtin.model.fused_decoder import FusedDecoder

    model = make_model().to(device="cuda", dtype=torch.bfloat16)
    decoder = FusedDecoder(model)
    token_ids = torch.tensor([0, 5, 17, 5, VOCAB_SIZE - 1, 3, 31], device="cuda")
    positions = torch.tensor([0, 1, 95, 3, 40, 7, 63], device="cuda")
    layer = decoder.layers[0]
    normed, hidden, rotary = embed_rms_norm(
        token_ids, positions, decoder.embed_tokens.weight, layer.input_norm, decoder.eps,
        decoder.rotary_table(96, decoder.embed_tokens.weight),
    )  # fmt: skip
    embedded = decoder.embed_tokens(token_ids)
    expected_normed, _ = add_rms_norm(embedded, None, layer.input_norm, decoder.eps)
    cos, sin = model.model.rotary_emb(embedded, positions[None])
    assert torch.equal(hidden, embedded) and torch.equal(normed, expected_normed)
    assert torch.equal(rotary[:, 0], cos[0]) and torch.equal(rotary[:, 1], sin[0])


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "dtype", "tolerance"),
    [(14, 2, 64, torch.bfloat16, 2e-2), (4, 2, 8, torch.float32, 1e-5)],
)
def test_prefill_attention_matches_causal_sdpa_over_each_rows_slot(
    heads, kv_heads, head_dim, dtype, tolerance
):
    from agentrl.engine.builtin.kernels.prefill_attention import prefill_attention

    generator = torch.Generator(device="cuda").manual_seed(0)
    keys, values = torch.randn((2, 6, kv_heads, 300, head_dim), generator=generator, device="cuda").to(dtype)
    spans = [(5, 0), (70, 3), (1, 130), (130, 0)]  # (new tokens, first position) of slots 1..4
    prompts = [[7] * (num_tokens + start) for num_tokens, start in spans]
    packed = PackedPrefill.of(PrefillRows.of(prompts, [start for _, start in spans], first_slot=1))
    tiles = packed.pad(packed.num_tokens, packed.tiles.shape[0] + 3, packed.num_rows).tiles  # empty tiles too
    queries = torch.randn((206, heads, head_dim), generator=generator, device="cuda").to(dtype)
    got = prefill_attention(queries, keys, values, tiles.to("cuda"), 0.3)
    expected, first = [], 0
    for slot, (num_tokens, start) in enumerate(spans, start=1):
        end = start + num_tokens
        k = keys[slot, :, :end].repeat_interleave(heads // kv_heads, dim=0).float()
        v = values[slot, :, :end].repeat_interleave(heads // kv_heads, dim=0).float()
        visible = (
            torch.arange(end, device="cuda")[None, :] <= torch.arange(start, end, device="cuda")[:, None]
        )
        q = queries[first : first + num_tokens].transpose(0, 1).float()
        expected.append(F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=0.3).transpose(0, 1))
        first += num_tokens
    torch.testing.assert_close(got.float(), torch.cat(expected), atol=tolerance, rtol=0)


def test_a_small_prefill_pass_replayed_from_a_graph_gives_the_eager_passs_logits_and_keys():
    prompts = [[(3 * i + j) % 60 + 1 for j in range(5 + 9 * i)] for i in range(5)]
    rows = PrefillRows.of(prompts, [0, 2, 0, 4, 0], first_slot=1)  # rows 1 and 3 start from cached keys
    results = []
    for graphs in (False, True):
        engine = TransformersEngine(tiny_qwen2(), [], EngineConfig(device="cuda", cuda_graphs=graphs))
        runner = engine.runner
        with torch.inference_mode():  # as on the engine's scheduler thread
            runner.grow_slots(64)  # with graphs, this captures every prefill bucket: 64..2048 tokens
            logits = runner.prefill(rows).clone()
            results.append((logits, runner.slots.keys.clone(), runner.slots.values.clone()))
        if graphs:
            assert runner.prefill_graphs.num_graphs == 6
        asyncio.run(engine.close())
    (eager, *eager_cache), (graphed, *graphed_cache) = results
    assert graphed.shape == eager.shape == (5, 64)
    torch.testing.assert_close(graphed, eager, atol=1e-5, rtol=0)
    for got, expected in zip(graphed_cache, eager_cache, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_a_split_k_product_summed_by_the_next_norm_rounds_as_one_linear_layer():
    from agentrl.engine.builtin.kernels.fused_kernels import add_rms_norm
    from agentrl.engine.builtin.model.fused_decoder import split_k_linear

    generator = torch.Generator(device="cuda").manual_seed(0)
    activations = torch.randn((48, 4864), generator=generator, device="cuda").bfloat16()
    weight = (torch.randn((896, 4864), generator=generator, device="cuda") / 70).bfloat16()
    residual = torch.randn((48, 896), generator=generator, device="cuda").bfloat16()
    norm_weight = (1 + torch.randn(896, generator=generator, device="cuda") / 10).bfloat16()
    normed, summed = add_rms_norm(split_k_linear(activations, weight, splits=4), residual, norm_weight, 1e-6)
    # The exact product, rounded to bf16 as a linear layer's output, then added in bf16; a float32 sum
    # of partials may round to a bf16 neighbour of the exact product, and the sum again.
    product = (activations.double() @ weight.double().T).bfloat16()
    expected = product + residual
    one_bf16_step = 2.0**-7  # relative
    bound = one_bf16_step * (product.float().abs() + expected.float().abs())
    assert ((summed.float() - expected.float()).abs() <= bound).all()
    assert (summed != expected).float().mean() < 0.01  # nearly every element rounds the same
    # The norm of the summed partials is the norm of that sum, as the kernel computes it for any input.
    assert torch.equal(normed, add_rms_norm(summed, None, norm_weight, 1e-6)[0])


def kernels_compiled_after_a_first_pass(model, passes: list[list[int]], monkeypatch) -> list[str]:
    """Triton kernels compiled by eager prefill passes of these prompt lengths, after one of 37 tokens."""
    import triton

    engine = TransformersEngine(model, [], EngineConfig(device="cuda", cuda_graphs=False))  # every pass eager
    runner = engine.runner
    compiled = []
    with torch.inference_mode():  # as on the engine's scheduler thread
        runner.grow_slots(max(64, *(max(lengths) for lengths in passes)))
        runner.prefill(PrefillRows.of([[3] * 37], [0], first_slot=0))
        monkeypatch.setattr(
            triton.knobs.runtime, "jit_cache_hook", lambda **call: compiled.append(call["repr"])
        )
        for lengths in passes:
            prompts = [[3] * length for length in lengths]
            runner.prefill(PrefillRows.of(prompts, [0] * len(prompts), first_slot=0))
        torch.cuda.synchronize()
    asyncio.run(engine.close())
    return compiled


def test_prefill_passes_of_any_length_reuse_the_kernels_the_first_pass_compiled(monkeypatch):
    # Token counts odd, even and divisible by 16; one row, several, and a single token.
    passes = [[38], [48], [5, 11], [1], [16, 16, 1]]
    # A compile would stall a running engine for a few hundred milliseconds.
    assert kernels_compiled_after_a_first_pass(tiny_qwen2(), passes, monkeypatch) == []


@pytest.mark.parametrize("make_model", [tiny_qwen2, tiny_llama, tiny_qwen3])
def test_rotary_looked_up_by_position_is_the_models_own_rotary_embedding(make_model):
    from agentrl.engine.builtin.model.fused_decoder import FusedDecoder

    model = make_model().to(device="cuda", dtype=torch.bfloat16)
    decoder = FusedDecoder(model)
    assert decoder.rotary_by_position
    hidden = torch.zeros((6, model.config.hidden_size), device="cuda", dtype=torch.bfloat16)
    token_ids = torch.zeros(6, dtype=torch.long, device="cuda")
    for positions, capacity in (([0, 5, 95, 17, 5, 64], 96), ([100, 5, 127, 0, 3, 96], 128)):  # then grown
        positions = torch.tensor(positions, device="cuda")
        _, _, cos, sin = decoder.embed(token_ids, positions, capacity)
        expected_cos, expected_sin = model.model.rotary_emb(hidden, positions[None])
        assert torch.equal(cos, expected_cos[0]) and torch.equal(sin, expected_sin[0])


def test_rotary_scaled_by_the_longest_position_is_computed_for_each_pass():
    from agentrl.engine.builtin.model.fused_decoder import FusedDecoder

    config = tiny_qwen2().config
    config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    model = Qwen2ForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)
    decoder = FusedDecoder(model)
    assert not decoder.rotary_by_position
    hidden = torch.zeros((3, config.hidden_size), device="cuda", dtype=torch.bfloat16)
    positions = torch.tensor([3, 200, 7], device="cuda")  # past max_position_embeddings: scaled
    _, _, cos, sin = decoder.embed(torch.zeros_like(positions), positions, capacity=256)
    expected_cos, expected_sin = model.model.rotary_emb(hidden, positions[None])
    assert torch.equal(cos, expected_cos[0]) and torch.equal(sin, expected_sin[0])
