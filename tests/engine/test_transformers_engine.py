"""The built-in engine's completions: exact versus transformers, and unchanged by batching."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from agentrl.engine import (
    FinishReason,
    Generation,
    InferenceEngine,
    SamplingParams,
    StepKind,
    TransformersEngine,
)
from tests.engine.conftest import on_cpu, tiny_qwen2, word_tokenizer

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17], [3]]
GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)
MIXED = [
    SamplingParams(max_new_tokens=9, temperature=1.0, seed=11),
    SamplingParams(max_new_tokens=6, temperature=0.7, top_k=5, seed=12),
    SamplingParams(max_new_tokens=12, temperature=0.0),
    SamplingParams(max_new_tokens=7, temperature=1.3, top_p=0.8, top_k=20, seed=14),
]


async def run_alone(model, prompts, params) -> list[Generation]:
    """Each request on its own, one after another, in a fresh engine."""
    async with TransformersEngine(model, [], on_cpu()) as engine:
        return [await engine.generate(p, s) for p, s in zip(prompts, params, strict=True)]


def full_forward_logprobs(
    model, prompt: list[int], generation: Generation, temperature: float
) -> list[float]:
    """What the trainer recomputes: log_softmax(logits / T) over prompt + completion."""
    ids = torch.tensor([prompt + generation.completion_ids], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    completion_ids = torch.tensor(generation.completion_ids, device=model.device)
    return logprobs.gather(-1, completion_ids[:, None]).squeeze(-1).tolist()


def assert_same_generations(got: list[Generation], expected: list[Generation]) -> None:
    for one, other in zip(got, expected, strict=True):
        assert one.completion_ids == other.completion_ids
        assert one.finish_reason == other.finish_reason
        assert one.logprobs == pytest.approx(other.logprobs, abs=1e-5)


def test_the_engine_satisfies_the_inference_engine_protocol():
    engine = TransformersEngine(tiny_qwen2(), [], on_cpu())
    assert isinstance(engine, InferenceEngine)
    asyncio.run(engine.close())


async def test_greedy_completions_equal_transformers_generate(any_tiny_model):
    async with TransformersEngine(any_tiny_model, [], on_cpu()) as engine:
        generations = await asyncio.gather(*[engine.generate(p, GREEDY) for p in PROMPTS])
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        reference = any_tiny_model.generate(
            torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert generation.completion_ids == reference[0, len(prompt) :].tolist()
        assert generation.finish_reason is FinishReason.LENGTH


async def test_batched_logprobs_equal_a_full_forward_pass_over_prompt_and_completion():
    model = tiny_qwen2()
    params = SamplingParams(max_new_tokens=10, temperature=0.7, seed=3)
    async with TransformersEngine(model, [], on_cpu()) as engine:
        generations = await asyncio.gather(*[engine.generate(p, params) for p in PROMPTS])
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        expected = full_forward_logprobs(model, prompt, generation, temperature=0.7)
        assert generation.logprobs == pytest.approx(expected, abs=1e-4)


async def test_requests_joining_mid_flight_get_the_same_tokens_and_logprobs_as_alone(any_tiny_model):
    records = []
    # A one-token prefill budget admits one request per iteration, so each joins a running batch.
    async with TransformersEngine(
        any_tiny_model, [], on_cpu(max_prefill_tokens=1), on_step=records.append
    ) as engine:
        batched = await asyncio.gather(*[engine.generate(p, s) for p, s in zip(PROMPTS, MIXED, strict=True)])
    assert [(r.kind, r.request_ids) for r in records[:4]] == [
        (StepKind.PREFILL, (0,)),
        (StepKind.DECODE, (0,)),
        (StepKind.PREFILL, (1,)),
        (StepKind.DECODE, (0, 1)),
    ]
    assert_same_generations(batched, await run_alone(any_tiny_model, PROMPTS, MIXED))


async def test_a_late_request_joins_at_the_next_decode_step_and_leaves_as_soon_as_it_finishes():
    model = tiny_qwen2()
    records, third_decode, late_submitted = [], threading.Event(), threading.Event()

    def on_step(record):
        records.append((record.kind, record.request_ids))
        if sum(kind is StepKind.DECODE for kind, _ in records) == 3:
            third_decode.set()
            late_submitted.wait(timeout=60)  # hold the scheduler until the late request is queued

    long_params, short_params = SamplingParams(10, temperature=0.0), SamplingParams(3, temperature=0.0)
    async with TransformersEngine(model, [], on_cpu(), on_step=on_step) as engine:
        first = asyncio.create_task(engine.generate(PROMPTS[0], long_params))
        await asyncio.to_thread(third_decode.wait, 60)
        second = asyncio.create_task(engine.generate(PROMPTS[1], short_params))
        await asyncio.sleep(0)  # lets the second task reach the engine's queue
        late_submitted.set()
        batched = await asyncio.gather(first, second)
    prefill, decode = StepKind.PREFILL, StepKind.DECODE
    assert (
        records
        == [(prefill, (0,))]
        + [(decode, (0,))] * 3
        + [(prefill, (1,))]
        + [(decode, (0, 1))] * 2
        + [(decode, (0,))] * 4
    )
    assert_same_generations(batched, await run_alone(model, PROMPTS[:2], [long_params, short_params]))


async def test_a_stop_token_ends_the_completion_and_is_included():
    model = tiny_qwen2()
    async with TransformersEngine(model, [], on_cpu()) as engine:
        free = await engine.generate(PROMPTS[0], GREEDY)
        # The first token that did not occur before it, at index 2 or later, becomes the stop token.
        stop_index = next(i for i in range(2, 8) if free.completion_ids[i] not in free.completion_ids[:i])
        stopped = await engine.generate(
            PROMPTS[0], SamplingParams(8, temperature=0.0, stop_token_ids=(free.completion_ids[stop_index],))
        )
    assert stopped.completion_ids == free.completion_ids[: stop_index + 1]
    assert stopped.logprobs == pytest.approx(free.logprobs[: stop_index + 1], abs=1e-6)
    assert stopped.finish_reason is FinishReason.STOP


async def test_the_tokenizers_eos_id_stops_a_completion():
    model = tiny_qwen2()
    async with TransformersEngine(model, [], on_cpu()) as engine:
        free = await engine.generate(PROMPTS[2], GREEDY)
    eos = free.completion_ids[0]
    async with TransformersEngine(model, word_tokenizer(eos_token_id=eos), on_cpu()) as engine:
        assert engine.eos_ids == frozenset({eos})
        stopped = await engine.generate(PROMPTS[2], GREEDY)
    assert (stopped.completion_ids, stopped.finish_reason) == ([eos], FinishReason.STOP)


async def test_the_model_context_limit_ends_a_completion_with_length():
    model = tiny_qwen2(max_position_embeddings=16)
    params = SamplingParams(max_new_tokens=10, temperature=0.0)
    async with TransformersEngine(model, [], on_cpu()) as engine:
        near_limit = await engine.generate(list(range(1, 15)), params)
        at_limit = await engine.generate(list(range(1, 17)), params)
        past_limit = await engine.generate(list(range(1, 21)), params)
    assert (len(near_limit.completion_ids), near_limit.finish_reason) == (2, FinishReason.LENGTH)
    assert (at_limit.completion_ids, at_limit.logprobs, at_limit.finish_reason) == (
        [],
        [],
        FinishReason.LENGTH,
    )
    assert (past_limit.completion_ids, past_limit.finish_reason) == ([], FinishReason.LENGTH)


async def test_top_k_one_and_a_tiny_top_p_sample_the_greedy_tokens():
    model = tiny_qwen2()
    async with TransformersEngine(model, [], on_cpu()) as engine:
        greedy = await engine.generate(PROMPTS[0], GREEDY)
        top_k = await engine.generate(PROMPTS[0], SamplingParams(8, temperature=1.0, top_k=1, seed=1))
        top_p = await engine.generate(PROMPTS[0], SamplingParams(8, temperature=1.0, top_p=1e-6, seed=2))
    assert top_k.completion_ids == greedy.completion_ids
    assert top_p.completion_ids == greedy.completion_ids


async def test_the_engine_seed_makes_unseeded_requests_reproducible():
    model = tiny_qwen2()
    params = SamplingParams(max_new_tokens=12, temperature=1.0)

    async def run(seed: int) -> list[list[int]]:
        async with TransformersEngine(model, [], on_cpu(), seed=seed) as engine:
            generations = await asyncio.gather(*[engine.generate(p, params) for p in PROMPTS])
        return [g.completion_ids for g in generations]

    first, again, other = await run(seed=5), await run(seed=5), await run(seed=6)
    assert first == again
    assert first != other


async def test_a_per_request_seed_overrides_the_engine_seed():
    model = tiny_qwen2()
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=99)
    completions = []
    for engine_seed in (1, 2):
        async with TransformersEngine(model, [], on_cpu(), seed=engine_seed) as engine:
            completions.append((await engine.generate(PROMPTS[0], params)).completion_ids)
    assert completions[0] == completions[1]


async def test_with_a_prefill_interval_a_late_request_joins_only_after_that_many_decode_steps():
    model = tiny_qwen2()
    records, first_decode, late_submitted = [], threading.Event(), threading.Event()

    def on_step(record):
        records.append((record.kind, record.request_ids))
        if records == [(StepKind.PREFILL, (0,)), (StepKind.DECODE, (0,))]:
            first_decode.set()
            late_submitted.wait(timeout=60)  # hold the scheduler until the late request is queued

    async with TransformersEngine(model, [], on_cpu(prefill_interval=3), on_step=on_step) as engine:
        first = asyncio.create_task(engine.generate(PROMPTS[0], SamplingParams(6, temperature=0.0)))
        await asyncio.to_thread(first_decode.wait, 60)
        second = asyncio.create_task(engine.generate(PROMPTS[1], SamplingParams(2, temperature=0.0)))
        await asyncio.sleep(0)
        late_submitted.set()
        await asyncio.gather(first, second)
    prefill, decode = StepKind.PREFILL, StepKind.DECODE
    assert records == [(prefill, (0,))] + [(decode, (0,))] * 3 + [(prefill, (1,)), (decode, (0, 1))] + [
        (decode, (0,))
    ]
