"""The engine's life around generation: weight updates, failures, cancellation, closing, load."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
import torch

from agentrl.engine import FinishReason, SamplingParams, StepKind, TransformersEngine
from agentrl.engine.config import EngineConfig
from tests.engine.conftest import on_cpu, tiny_qwen2, word_tokenizer

PROMPT = [1, 2, 3, 4, 5]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


Steps = list[tuple[StepKind, tuple[int, ...]]]


class StepGate:
    """An `on_step` observer that records every step and holds the scheduler at each step `when`
    picks (given the steps so far, the current one last) until released."""

    def __init__(self, when: Callable[[Steps], bool]) -> None:
        self.records: Steps = []
        self.when = when
        self.reached, self.released = threading.Event(), threading.Event()

    @classmethod
    def after_decode(cls, count: int) -> StepGate:
        """Holds once, at the `count`-th decode step."""
        return cls(
            lambda steps: (
                steps[-1][0] is StepKind.DECODE and [k for k, _ in steps].count(StepKind.DECODE) == count
            )
        )

    def __call__(self, record) -> None:
        self.records.append((record.kind, record.request_ids))
        if self.when(self.records):
            self.reached.set()
            self.released.wait(timeout=60)
            self.released.clear()

    async def wait_reached(self) -> None:
        await asyncio.to_thread(self.reached.wait, 60)
        self.reached.clear()


async def greedy_alone(model) -> list[int]:
    async with TransformersEngine(model, [], on_cpu()) as engine:
        return (await engine.generate(PROMPT, GREEDY)).completion_ids


@pytest.mark.parametrize("lookahead", [0, 1, 4])
async def test_a_weight_update_waits_for_running_requests_and_later_requests_use_the_new_weights(
    lookahead,
):
    old_model, new_model = tiny_qwen2(seed=0), tiny_qwen2(seed=1)
    expected_old, expected_new = await greedy_alone(old_model), await greedy_alone(new_model)
    assert expected_old != expected_new
    gate = StepGate.after_decode(1)
    async with TransformersEngine(
        tiny_qwen2(seed=0), [], on_cpu(decode_lookahead=lookahead), on_step=gate
    ) as engine:
        running = asyncio.create_task(engine.generate(PROMPT, GREEDY))
        await gate.wait_reached()
        update = asyncio.create_task(engine.update_weights(new_model.state_dict(), version=1))
        await asyncio.sleep(0)
        later = asyncio.create_task(engine.generate(PROMPT, GREEDY))
        await asyncio.sleep(0)
        gate.released.set()
        before, _, after = await asyncio.gather(running, update, later)
    assert (before.completion_ids, before.policy_version) == (expected_old, 0)
    assert (after.completion_ids, after.policy_version) == (expected_new, 1)
    prefill, decode = StepKind.PREFILL, StepKind.DECODE
    assert (
        gate.records == [(prefill, (0,))] + [(decode, (0,))] * 11 + [(prefill, (1,))] + [(decode, (1,))] * 11
    )
    assert engine.policy_version == 1


async def test_a_state_dict_with_unknown_names_or_wrong_shapes_is_rejected():
    async with TransformersEngine(tiny_qwen2(), [], on_cpu()) as engine:
        with pytest.raises(ValueError, match="names the model lacks"):
            await engine.update_weights({"module.lm_head.weight": torch.zeros(64, 32)}, version=1)
        with pytest.raises(ValueError, match=r"state_dict\['lm_head.weight'\] has shape \(64, 31\)"):
            await engine.update_weights({"lm_head.weight": torch.zeros(64, 31)}, version=1)
        assert engine.policy_version == 0


async def test_a_partial_state_dict_updates_only_the_named_parameters():
    model = tiny_qwen2()
    async with TransformersEngine(model, [], on_cpu()) as engine:
        embeddings_before = model.model.embed_tokens.weight.clone()
        await engine.update_weights({"lm_head.weight": torch.zeros(64, 32)}, version=4)
        generation = await engine.generate(PROMPT, SamplingParams(max_new_tokens=2, temperature=0.0))
    assert torch.equal(model.model.embed_tokens.weight, embeddings_before)
    # All-zero output weights make every token equally likely: argmax picks token 0, logprob -log 64.
    assert generation.completion_ids == [0, 0]
    assert generation.logprobs == pytest.approx([-torch.log(torch.tensor(64.0)).item()] * 2, abs=1e-6)
    assert generation.policy_version == 4


async def test_an_error_inside_the_scheduler_reaches_every_waiting_caller_and_the_engine_recovers():
    model = tiny_qwen2()

    def fail(module, args, kwargs):
        raise RuntimeError("forward failed on purpose")

    async with TransformersEngine(model, [], on_cpu()) as engine:
        hook = model.register_forward_pre_hook(fail, with_kwargs=True)
        results = await asyncio.gather(
            engine.generate(PROMPT, GREEDY), engine.generate([7, 8], GREEDY), return_exceptions=True
        )
        hook.remove()
        recovered = await engine.generate(PROMPT, GREEDY)
    assert [str(r) for r in results] == ["forward failed on purpose"] * 2
    assert all(isinstance(r, RuntimeError) for r in results)
    assert recovered.completion_ids == await greedy_alone(model)


@pytest.mark.parametrize("lookahead", [0, 1, 4])
async def test_a_cancelled_request_leaves_the_batch_at_the_next_step(lookahead):
    gate = StepGate.after_decode(2)
    async with TransformersEngine(
        tiny_qwen2(), [], on_cpu(decode_lookahead=lookahead), on_step=gate
    ) as engine:
        doomed = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_new_tokens=50)))
        await gate.wait_reached()
        doomed.cancel()
        await asyncio.sleep(0)  # lets the cancellation reach the request
        gate.released.set()
        survivor = await engine.generate([7, 8], SamplingParams(max_new_tokens=3, temperature=0.0))
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert gate.records == [
        (StepKind.PREFILL, (0,)),
        (StepKind.DECODE, (0,)),
        (StepKind.DECODE, (0,)),
        (StepKind.PREFILL, (1,)),
        (StepKind.DECODE, (1,)),
        (StepKind.DECODE, (1,)),
    ]
    assert len(survivor.completion_ids) == 3


async def test_closing_fails_running_requests_and_refuses_new_ones():
    gate = StepGate.after_decode(1)
    engine = TransformersEngine(tiny_qwen2(), [], on_cpu(), on_step=gate)
    running = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_new_tokens=50)))
    await gate.wait_reached()
    closing = asyncio.create_task(engine.close())
    await asyncio.sleep(0)
    gate.released.set()
    await closing
    with pytest.raises(RuntimeError, match="closed before this request finished"):
        await running
    with pytest.raises(RuntimeError, match="is closed"):
        await engine.generate(PROMPT, GREEDY)
    await engine.close()  # closing twice is harmless


async def test_hundreds_of_concurrent_callers_share_forward_passes():
    max_new = [1 + i % 6 for i in range(200)]
    prompts = [[1 + i % 50, 2 + i % 7, 3] for i in range(200)]
    gate = StepGate.after_decode(1)
    async with TransformersEngine(tiny_qwen2(), [], on_cpu(max_batch_size=64), on_step=gate) as engine:
        # A first request holds the scheduler until all 200 callers have queued theirs.
        first = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_new_tokens=3)))
        await gate.wait_reached()
        callers = [
            engine.generate(p, SamplingParams(max_new_tokens=n))
            for p, n in zip(prompts, max_new, strict=True)
        ]
        tasks = [asyncio.create_task(caller) for caller in callers]
        await asyncio.sleep(0)
        gate.released.set()
        generations = await asyncio.gather(*tasks)
        await first
    assert [len(g.completion_ids) for g in generations] == max_new
    assert all(g.finish_reason is FinishReason.LENGTH for g in generations)
    # The first prefill after the release fills the batch up to its 64 rows, and no pass exceeds it.
    assert gate.records[2] == (StepKind.PREFILL, tuple(range(1, 64)))
    assert max(len(request_ids) for _, request_ids in gate.records) <= 64
    assert engine.stats.num_generated_tokens == 3 + sum(max_new) == 699
    # One forward pass per request and token would be 699; shared passes need far fewer.
    assert engine.stats.num_prefill_steps + engine.stats.num_decode_steps < 100


@pytest.mark.parametrize(
    ("prompt", "message"),
    [([], "prompt_ids is empty"), ([1, 64], "token id 64 is outside"), ([-1, 2], "token id -1 is outside")],
)
async def test_bad_prompts_are_rejected_before_any_pass(prompt, message):
    async with TransformersEngine(tiny_qwen2(), [], on_cpu()) as engine:
        with pytest.raises(ValueError, match=message):
            await engine.generate(prompt, GREEDY)
        assert engine.stats.num_prefill_steps == 0


async def test_a_prompt_outside_the_vocabulary_fails_alone_and_its_pass_runs_the_others():
    async with TransformersEngine(tiny_qwen2(), [], on_cpu()) as engine:
        first, bad, last = await asyncio.gather(
            engine.generate(PROMPT, GREEDY),
            engine.generate([1, 2, 64, 3, 70], GREEDY),
            engine.generate([7, 8], GREEDY),
            return_exceptions=True,
        )
        assert isinstance(bad, ValueError)
        assert str(bad) == "prompt token id 64 is outside the vocabulary [0, 64)"  # its first bad token
        assert engine.stats.num_prefill_steps == 1 and engine.stats.num_prompt_tokens == 5 + 2
        assert first.completion_ids == (await engine.generate(PROMPT, GREEDY)).completion_ids
        assert last.completion_ids == (await engine.generate([7, 8], GREEDY)).completion_ids


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size\n  Input should be greater than 0"),
        ({"max_prefill_tokens": 0}, "max_prefill_tokens\n  Input should be greater than 0"),
        ({"prefill_interval": 0}, "prefill_interval\n  Input should be greater than 0"),
        ({"prefix_cache_bytes": -1}, "prefix_cache_bytes\n  Input should be greater than or equal to 0"),
        ({"decode_lookahead": -1}, "decode_lookahead\n  Input should be greater than or equal to 0"),
    ],
)
def test_bad_engine_knobs_are_rejected_when_the_engine_section_is_built(knobs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**knobs)


def test_a_bad_dtype_or_the_sglang_section_is_rejected_by_the_engine():
    with pytest.raises(ValueError, match="dtype=.float33. is not supported"):
        TransformersEngine(tiny_qwen2(), [], on_cpu(), dtype="float33")
    sglang = EngineConfig(backend="sglang", url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="engine.backend=transformers; got sglang"):
        TransformersEngine(tiny_qwen2(), [], sglang)


def test_sliding_window_models_are_rejected():
    model = tiny_qwen2()
    model.config.layer_types = ["sliding_attention", "full_attention"]
    with pytest.raises(ValueError, match="sliding_attention"):
        TransformersEngine(model, [], on_cpu())


async def test_from_pretrained_serves_a_saved_checkpoint_with_its_tokenizer_eos(tmp_path):
    model = tiny_qwen2()
    model.generation_config.eos_token_id = None
    model.save_pretrained(tmp_path)
    word_tokenizer(eos_token_id=9).save_pretrained(tmp_path)
    expected = await greedy_alone(model)
    async with TransformersEngine.from_pretrained(str(tmp_path), on_cpu(), dtype="float32") as engine:
        assert engine.eos_ids == frozenset({9})
        generation = await engine.generate(PROMPT, SamplingParams(max_new_tokens=12, temperature=0.0))
    stop = expected.index(9) + 1 if 9 in expected else len(expected)
    assert generation.completion_ids == expected[:stop]
