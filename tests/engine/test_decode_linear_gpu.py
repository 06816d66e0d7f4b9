"""Decode-step projections in Triton, and kernels launched dependently, against cuBLAS and normal launches, on CUDA."""

from __future__ import annotations

import asyncio

import pytest
import torch
import torch.nn.functional as F

from agentrl.engine import SamplingParams, TransformersEngine
from agentrl.engine.config import EngineConfig
from tests.engine.conftest import tiny_qwen2
from tests.engine.test_transformers_engine import PROMPTS, assert_same_generations

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("num_rows", [1, 16, 100, 256])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_decode_projection_is_a_float32_sum_rounded_once(num_rows, with_bias):
    from agentrl.engine.builtin.kernels.decode_linear import decode_linear

    generator = torch.Generator(device="cuda").manual_seed(num_rows)
    wide = torch.randn((num_rows, 1200), generator=generator, device="cuda").to(torch.bfloat16)
    x = wide[:, 100:996]  # rows strided, as a slice of the packed q/k/v output is
    weight = (0.03 * torch.randn((1152, 896), generator=generator, device="cuda")).to(torch.bfloat16)
    bias = torch.randn(1152, generator=generator, device="cuda").to(torch.bfloat16) if with_bias else None
    got = decode_linear(x, weight, bias)
    assert got.shape == (num_rows, 1152) and got.dtype == torch.bfloat16
    # Within a bf16 step of the exact product, or of the float32 sum's own error where products cancel.
    exact = x.double() @ weight.double().T + (bias.double() if with_bias else 0)
    bound = 2.0**-7 * exact.abs() + 2.0**-14 * (x.double().abs() @ weight.double().abs().T)
    excess = (got.double() - exact).abs() - bound
    assert excess.max() <= 0, f"{(excess > 0).sum()} elements off by up to {excess.max():.3g} past the bound"
    # A float32 product rounded once gives nearly every element exactly (sums in another order may differ).
    rounded_once = F.linear(x.float(), weight.float(), bias.float() if with_bias else None).bfloat16()
    assert (got == rounded_once).float().mean() > 0.99


def test_float32_weights_large_weights_and_steps_past_the_largest_bucket_keep_cublas():
    from agentrl.engine.builtin.kernels.decode_linear import (
        MAX_ROWS,
        MAX_WEIGHT_BYTES,
        decode_linear,
        runs_in_triton,
    )

    generator = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn((64, 32), generator=generator, device="cuda")
    x = torch.randn((8, 32), generator=generator, device="cuda")
    assert torch.equal(decode_linear(x, weight, None), F.linear(x, weight))
    half = weight.to(torch.bfloat16)
    many = torch.randn((MAX_ROWS + 1, 32), generator=generator, device="cuda").to(torch.bfloat16)
    assert torch.equal(decode_linear(many, half, None), F.linear(many, half))
    large = torch.randn((MAX_WEIGHT_BYTES // (2 * 32) + 1, 32), generator=generator, device="cuda").bfloat16()
    assert not runs_in_triton(8, large) and runs_in_triton(8, half) and not runs_in_triton(8, weight)
    assert torch.equal(decode_linear(x.bfloat16(), large, None), F.linear(x.bfloat16(), large))


async def generate_in_bfloat16() -> list:
    params = [SamplingParams(max_new_tokens=30, temperature=1.0, seed=i) for i in range(len(PROMPTS))]
    async with TransformersEngine(tiny_qwen2().to(torch.bfloat16), [], EngineConfig(device="cuda")) as engine:
        return await asyncio.gather(*[engine.generate(p, s) for p, s in zip(PROMPTS, params, strict=True)])


def test_kernels_launched_dependently_in_step_graphs_sample_what_normal_launches_sample(monkeypatch):
    from agentrl.engine.builtin.kernels import dependent_launch

    cuda = torch.device("cuda")
    normal = {"DEPENDENT": False}
    dependent_options = {"DEPENDENT": True, "launch_pdl": True}
    hopper = torch.cuda.get_device_capability() >= (9, 0)
    assert dependent_launch.launch_options(cuda, dependent=True) == (dependent_options if hopper else normal)
    assert dependent_launch.launch_options(cuda, dependent=False) == normal
    dependent = asyncio.run(generate_in_bfloat16())
    monkeypatch.setattr(dependent_launch, "_supported", lambda device_index: False)
    assert dependent_launch.launch_options(cuda, dependent=True) == normal
    assert_same_generations(dependent, asyncio.run(generate_in_bfloat16()))


@pytest.mark.parametrize("num_rows", [1, 16, 50, 128])
@pytest.mark.parametrize(("dtype", "with_bias"), [(torch.bfloat16, False), (torch.float16, True)])
def test_the_decode_gate_up_projection_rounds_as_the_product_then_the_activation(num_rows, dtype, with_bias):
    from agentrl.engine.builtin.kernels.decode_linear import decode_gate_up_silu, runs_gate_up_in_triton
    from agentrl.engine.builtin.kernels.fused_kernels import silu_and_multiply

    generator = torch.Generator(device="cuda").manual_seed(num_rows)
    # Features and inputs that are not multiples of the blocks: edge blocks load zeros.
    x = torch.randn((num_rows, 360), generator=generator, device="cuda").to(dtype)
    weight = (torch.randn((1200, 360), generator=generator, device="cuda") / 360**0.5).to(dtype)
    bias = torch.randn(1200, generator=generator, device="cuda").to(dtype) if with_bias else None
    assert runs_gate_up_in_triton(num_rows, weight)
    got = decode_gate_up_silu(x, weight, bias)
    # As cuBLAS's epilogue, the bias joins the float32 sum before gate and up are rounded.
    product = F.linear(x.float(), weight.float(), bias.float() if with_bias else None).to(dtype)
    expected = silu_and_multiply(product)
    assert got.shape == (num_rows, 600) and got.dtype == dtype
    # Only the float32 sums' order may differ: nearly every element is the same, and the rest
    # differ by a rounding step of gate or up carried through the activation.
    assert (got == expected).float().mean() > 0.99
    torch.testing.assert_close(got, expected, rtol=2**-6, atol=2**-10)


def test_float32_large_weights_and_steps_past_the_gate_up_limits_keep_cublas_and_the_activation_kernel():
    from agentrl.engine.builtin.kernels.decode_linear import (
        MAX_GATE_UP_ROWS,
        MAX_GATE_UP_WEIGHT_BYTES,
        decode_gate_up_silu,
        runs_gate_up_in_triton,
    )
    from agentrl.engine.builtin.kernels.fused_kernels import silu_and_multiply

    generator = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn((64, 32), generator=generator, device="cuda")
    large = torch.randn((MAX_GATE_UP_WEIGHT_BYTES // (2 * 32) + 2, 32), generator=generator, device="cuda")
    rows = torch.randn((MAX_GATE_UP_ROWS + 1, 32), generator=generator, device="cuda")
    assert runs_gate_up_in_triton(8, weight.bfloat16())
    for x, w in [
        (rows[:8], weight),
        (rows[:8].bfloat16(), large.bfloat16()),
        (rows.bfloat16(), weight.bfloat16()),
    ]:
        assert not runs_gate_up_in_triton(x.shape[0], w)
        assert torch.equal(decode_gate_up_silu(x, w, None), silu_and_multiply(F.linear(x, w)))
