"""Overlapped decoding (steps launched before the earlier ones are read): nothing observable changes.

On CUDA the engine launches `CUDA_DECODE_LOOKAHEAD` steps ahead by default; here the same
scheduler runs on CPU with a lookahead forced on and is compared with reading every step at once.
The weight-update and cancellation tests of `test_engine_lifecycle` run with and without it.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from agentrl.engine import FinishReason, SamplingParams, StepKind, TransformersEngine
from agentrl.engine.builtin.scheduler.pending_step import PendingStep, sample_sources
from agentrl.engine.builtin.scheduler.request import Request
from tests.engine.conftest import on_cpu, tiny_qwen2
from tests.engine.test_engine_lifecycle import StepGate
from tests.engine.test_transformers_engine import MIXED, PROMPTS, assert_same_generations

CPU = torch.device("cpu")

STOPPING = [
    SamplingParams(max_new_tokens=30, temperature=1.0, seed=i, stop_token_ids=[3, 17, 40]) for i in range(4)
]
# Done at its prefill token: it leaves the batch before any decode step.
ONE_TOKEN = SamplingParams(max_new_tokens=1, temperature=1.0, seed=5)


async def generate(model, prompts, params, **knobs):
    records = []
    async with TransformersEngine(model, [], on_cpu(**knobs), on_step=records.append) as engine:
        generations = await asyncio.gather(
            *[engine.generate(p, s) for p, s in zip(prompts, params, strict=True)]
        )
        stats = engine.stats
    return generations, [(r.kind, r.request_ids) for r in records], stats


@pytest.mark.parametrize("lookahead", [1, 4])
async def test_overlapped_decoding_samples_and_records_what_step_by_step_decoding_does(
    any_tiny_model, lookahead
):
    prompts, params = PROMPTS + PROMPTS + [[4, 5, 6]], MIXED + STOPPING + [ONE_TOKEN]
    # A one-token prefill budget admits one request per iteration: rows join a running batch.
    plain = await generate(any_tiny_model, prompts, params, max_prefill_tokens=1, decode_lookahead=0)
    overlapped = await generate(
        any_tiny_model, prompts, params, max_prefill_tokens=1, decode_lookahead=lookahead
    )
    assert_same_generations(overlapped[0], plain[0])
    assert {g.finish_reason for g in plain[0]} == {FinishReason.STOP, FinishReason.LENGTH}
    assert len(overlapped[0][-1].completion_ids) == 1
    # A row is recorded only in the decode steps whose token it kept: one per token after the first.
    generations, records, stats = overlapped
    for request_id, generation in enumerate(generations):
        steps = [ids for kind, ids in records if kind is StepKind.DECODE and request_id in ids]
        assert len(steps) == len(generation.completion_ids) - 1
    assert stats.num_generated_tokens == sum(len(g.completion_ids) for g in generations)


@pytest.mark.parametrize("lookahead", [1, 4])
async def test_overlapped_decoding_with_the_prefix_cache_matches_it_without_overlap(lookahead):
    prompt = list(range(1, 40))
    params = [SamplingParams(max_new_tokens=12, temperature=1.0, seed=i) for i in range(4)]
    plain = await generate(tiny_qwen2(), [prompt] * 4, params, decode_lookahead=0)
    overlapped = await generate(tiny_qwen2(), [prompt] * 4, params, decode_lookahead=lookahead)
    assert_same_generations(overlapped[0], plain[0])


def test_a_row_feeds_on_the_sample_of_the_last_pending_pass_that_computed_it():
    first, second, third, fourth = (Request.__new__(Request) for _ in range(4))  # identity is all that counts
    picked = torch.zeros((2, 2), dtype=torch.float64)
    pending = [
        PendingStep.launch([first, second], picked, first_sample=0, decode=True, device=CPU),
        PendingStep.launch(
            [third], picked[:, :1], first_sample=8 + 3, decode=False, device=CPU
        ),  # a prefill into slot 3
        PendingStep.launch([second, first], picked, first_sample=0, decode=True, device=CPU),
    ]
    assert sample_sources([first, second, third, fourth], pending) == [1, 0, 11, -1]


async def group_with_a_row_cancelled_mid_iteration(cancel: bool, lookahead: int) -> list:
    """Rows 1-4 join a running row in one iteration of two prefill passes; row 1 may be cancelled
    during the first, while row 2's first token is still unread (retiring row 1 there would move
    row 2 and give its slot, and that slot's sample entry, to the second pass)."""
    shared, other = list(range(1, 21)), list(range(30, 50))
    params = [SamplingParams(max_new_tokens=6, temperature=1.0, seed=seed) for seed in range(4)]
    first_pass = (StepKind.PREFILL, (1, 2))  # the group's leader and the other prompt; then the rest
    gate = StepGate(lambda steps: steps[-1][0] is StepKind.DECODE or steps[-1] == first_pass)
    async with TransformersEngine(
        tiny_qwen2(), [], on_cpu(decode_lookahead=lookahead), on_step=gate
    ) as engine:
        running = asyncio.create_task(engine.generate([5, 6, 7], SamplingParams(max_new_tokens=40)))
        await gate.wait_reached()  # at its first decode step: the next four arrive together
        leader, *rest = [
            asyncio.create_task(engine.generate(prompt, p))
            for prompt, p in zip([shared, other, shared, shared], params, strict=True)
        ]
        await asyncio.sleep(0)
        gate.when = lambda steps: steps[-1] == first_pass
        gate.released.set()
        await gate.wait_reached()
        if cancel:
            leader.cancel()
            await asyncio.sleep(0)  # lets the cancellation reach the request
        gate.released.set()
        generations = await asyncio.gather(*rest)
        running.cancel()
    return generations


@pytest.mark.parametrize("lookahead", [0, 1, 4])
async def test_a_row_cancelled_between_prefill_passes_changes_no_other_row(lookahead):
    expected = await group_with_a_row_cancelled_mid_iteration(cancel=False, lookahead=lookahead)
    observed = await group_with_a_row_cancelled_mid_iteration(cancel=True, lookahead=lookahead)
    assert_same_generations(observed, expected)


class RecordedEvent:
    """Stands in for a CUDA event: records that the host waited for it."""

    def __init__(self, waited: list) -> None:
        self.waited = waited

    def synchronize(self) -> None:
        self.waited.append(self)


async def test_a_failure_waits_for_the_launched_steps_it_drops(monkeypatch):
    """A step still queued on the device reads its staged block and writes its pick buffer entry,
    which the steps after a failure reuse: the scheduler waits for every step it drops unread."""
    launched, waited = [], []
    launch = PendingStep.launch

    def launch_with_an_event(requests, picked, first_sample, decode, device):
        step = launch(requests, picked, first_sample, decode, device)
        step = dataclasses.replace(step, ready=RecordedEvent(waited))
        launched.append(step.ready)
        return step

    monkeypatch.setattr(PendingStep, "launch", staticmethod(launch_with_an_event))
    model = tiny_qwen2()
    # The first request decodes, overlapped, while the second one's prefill pass fails.
    async with TransformersEngine(model, [], on_cpu(max_prefill_tokens=1, decode_lookahead=2)) as engine:
        prefill = engine.runner.prefill
        calls = []

        def second_pass_fails(rows):
            calls.append(rows)
            if len(calls) == 2:
                raise RuntimeError("prefill failed")
            return prefill(rows)

        engine.runner.prefill = second_pass_fails
        first = asyncio.create_task(engine.generate(PROMPTS[0], MIXED[0]))
        await asyncio.sleep(0)
        results = await asyncio.gather(first, engine.generate(PROMPTS[1], MIXED[1]), return_exceptions=True)
    assert [str(r) for r in results] == ["prefill failed"] * 2
    # Every step was waited for: the ones read, and the ones the failure dropped.
    assert len(launched) >= 2 and {id(e) for e in launched} == {id(e) for e in waited}


@pytest.mark.parametrize("lookahead", [1, 4])
async def test_when_a_decode_step_is_launched_all_but_the_last_lookahead_steps_have_been_waited_for(
    monkeypatch, lookahead
):
    """What lets a decode step reuse the staged block and the pick buffer entry of the step
    lookahead + 1 before it (`decode_graphs`, `model_runner`): that step has run."""
    unread, most_unread = set(), []
    launch, wait = PendingStep.launch, PendingStep.wait

    def launch_recorded(requests, picked, first_sample, decode, device):
        step = launch(requests, picked, first_sample, decode, device)
        if decode:
            most_unread.append(len(unread))
            unread.add(id(step))
        return step

    def wait_recorded(step: PendingStep) -> None:
        unread.discard(id(step))
        wait(step)

    monkeypatch.setattr(PendingStep, "launch", staticmethod(launch_recorded))
    monkeypatch.setattr(PendingStep, "wait", wait_recorded)
    prompts, params = PROMPTS + PROMPTS, MIXED + STOPPING
    await generate(tiny_qwen2(), prompts, params, max_prefill_tokens=1, decode_lookahead=lookahead)
    assert len(most_unread) > 20 and max(most_unread) == lookahead


@pytest.mark.parametrize("lookahead", [0, 1, 4])
async def test_a_row_leaves_the_batch_once_its_last_token_is_on_the_way(monkeypatch, lookahead):
    """Rows without a stop token end at their token budget: the host knows which launched step
    samples a row's last token, and no later step computes a token of that row to drop."""
    decodes = []
    launch = PendingStep.launch

    def launch_counted(requests, picked, first_sample, decode, device):
        decodes.extend([[r.request_id for r in requests]] if decode else [])
        return launch(requests, picked, first_sample, decode, device)

    params = [SamplingParams(max_new_tokens=n, temperature=1.0, seed=n) for n in (3, 7, 1)]
    prompts = [[4, 5, 6], [7, 8], [9]]
    plain = await generate(tiny_qwen2(), prompts, params, decode_lookahead=0)
    monkeypatch.setattr(PendingStep, "launch", staticmethod(launch_counted))
    overlapped = await generate(tiny_qwen2(), prompts, params, decode_lookahead=lookahead)
    assert [len(g.completion_ids) for g in overlapped[0]] == [3, 7, 1]
    assert_same_generations(overlapped[0], plain[0])
    # After the prefill pass's tokens, the first row needs 2 steps and the second 6; the third none.
    # The second moves into the first's slot.
    assert decodes == [[0, 1]] * 2 + [[1]] * 4
