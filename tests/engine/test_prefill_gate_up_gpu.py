"""A prefill pass's gate/up projection with SiLU-and-multiply in its epilogue, against the two-kernel path, on CUDA."""

from __future__ import annotations

import asyncio

import pytest
import torch
import torch.nn.functional as F

from agentrl.engine import SamplingParams, TransformersEngine
from agentrl.engine.config import EngineConfig
from tests.engine.conftest import tiny_qwen2
from tests.engine.test_fused_gpu import kernels_compiled_after_a_first_pass
from tests.engine.test_transformers_engine import PROMPTS, assert_same_generations

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
needs_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
    reason="needs a Hopper or newer GPU: the fused kernel moves tiles with the tensor memory accelerator",
)


def operands(num_tokens: int, hidden: int, intermediate: int, dtype=torch.bfloat16):
    generator = torch.Generator(device="cuda").manual_seed(num_tokens)
    x = torch.randn((num_tokens, hidden), generator=generator, device="cuda").to(dtype)
    weight = (torch.randn((2 * intermediate, hidden), generator=generator, device="cuda") / hidden**0.5).to(
        dtype
    )
    return x, weight


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_fused_pass_rounds_as_the_product_then_the_activation(dtype):
    from agentrl.engine.builtin.kernels.fused_kernels import silu_and_multiply
    from agentrl.engine.builtin.kernels.prefill_gate_up import gate_up_silu, runs_fused

    # Tokens, features and inputs that are not multiples of the tiles: edge tiles load zeros.
    x, weight = operands(4100, 360, 600, dtype)
    assert runs_fused(x, weight, None)
    got = gate_up_silu(x, weight)
    expected = silu_and_multiply(F.linear(x, weight))
    assert got.shape == (4100, 600) and got.dtype == dtype
    # Only the float32 sums' order differs from cuBLAS: nearly every element is the same, and
    # the rest differ by a rounding step of gate or up carried through the activation.
    assert (got == expected).float().mean() > 0.99
    torch.testing.assert_close(got, expected, rtol=2**-6, atol=2**-10)


def test_short_passes_float32_biases_and_unaligned_rows_keep_the_product_then_the_activation():
    from agentrl.engine.builtin.kernels.fused_kernels import silu_and_multiply
    from agentrl.engine.builtin.kernels.prefill_gate_up import MIN_TOKENS, gate_up_silu, runs_fused

    x, weight = operands(MIN_TOKENS, 360, 600)
    bias = torch.ones(1200, device="cuda", dtype=torch.bfloat16)
    wide_x, wide_weight = operands(MIN_TOKENS, 360, 603)  # 603 outputs: rows of 1206 bytes
    cases = [
        (x[:-1], weight, None),
        (x.float(), weight.float(), None),
        (x, weight, bias),
        (wide_x, wide_weight, None),
    ]
    for x_case, weight_case, bias_case in cases:
        assert not runs_fused(x_case, weight_case, bias_case)
        expected = silu_and_multiply(F.linear(x_case, weight_case, bias_case))
        assert torch.equal(gate_up_silu(x_case, weight_case, bias_case), expected)
    hopper = torch.cuda.get_device_capability() >= (9, 0)
    assert runs_fused(x, weight, None) == hopper


async def generate_in_bfloat16() -> list:
    params = [SamplingParams(max_new_tokens=20, temperature=1.0, seed=i) for i in range(len(PROMPTS))]
    async with TransformersEngine(tiny_qwen2().to(torch.bfloat16), [], EngineConfig(device="cuda")) as engine:
        return await asyncio.gather(*[engine.generate(p, s) for p, s in zip(PROMPTS, params, strict=True)])


@needs_hopper
def test_prefill_passes_through_the_fused_kernel_sample_what_the_two_kernels_sample(monkeypatch):
    from agentrl.engine.builtin.kernels import prefill_gate_up
    from agentrl.engine.builtin.model import fused_decoder

    unfused = asyncio.run(generate_in_bfloat16())
    fused_passes = []

    def counted(x, weight, bias=None):
        fused_passes.append(prefill_gate_up.runs_fused(x, weight, bias))
        return prefill_gate_up.gate_up_silu(x, weight, bias)

    # Prefill passes (padded to 16 tokens) run fused; decode steps take `decode_gate_up_silu`.
    monkeypatch.setattr(prefill_gate_up, "MIN_TOKENS", 8)
    monkeypatch.setattr(fused_decoder, "gate_up_silu", counted)
    fused = asyncio.run(generate_in_bfloat16())
    assert fused_passes and all(fused_passes)
    assert_same_generations(fused, unfused)


@needs_hopper
def test_fused_prefill_passes_of_any_length_reuse_the_kernel_the_first_pass_compiled(monkeypatch):
    from agentrl.engine.builtin.kernels import prefill_gate_up

    monkeypatch.setattr(prefill_gate_up, "MIN_TOKENS", 8)  # every pass below runs fused
    model = tiny_qwen2(max_position_embeddings=512).to(torch.bfloat16)
    # Passes of 48 to 784 tokens (eager passes are padded to a multiple of 16): a few tiles, many.
    passes = [[38], [48], [5, 11], [200, 97], [260, 260, 260]]
    assert kernels_compiled_after_a_first_pass(model, passes, monkeypatch) == []
