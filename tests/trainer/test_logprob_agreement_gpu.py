"""Engine and trainer agree: the policy worker's bf16 logprobs of tokens the engine sampled in bf16.

Both load the same checkpoint (the shipped tiny policy), so the only differences left are
kernel-level: the engine's incremental decode with a KV cache against the trainer's one
forward pass over the whole sequence (packed or padded). The gap is printed so that runs on the
device record it; the bounds catch a real disagreement (a wrong temperature, an off-by-one
position, stale weights), which moves logprobs by whole nats.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoTokenizer

from agentrl.engine import SamplingParams, TransformersEngine
from agentrl.engine.config import EngineConfig
from agentrl.rollout.trajectory import Trajectory
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from agentrl.trainer.actor_config import ActorConfig
from agentrl.trainer.batch import TrainBatch, build_train_batch
from agentrl.trainer.policy_worker import PolicyWorker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TEMPERATURE = 0.8
QUESTIONS = [
    f"What is {a} + {b}?" for a, b in [(3, 4), (12, 30), (7, 8), (120, 5), (9, 9), (41, 1), (2, 77), (60, 6)]
]


def prompt_ids(tokenizer) -> list[list[int]]:
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in QUESTIONS
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


async def sampled_batch(engine: TransformersEngine, prompts: list[list[int]]) -> TrainBatch:
    """Two samples per prompt at TEMPERATURE, as a TrainBatch carrying the engine's logprobs."""
    requests = [
        engine.generate(prompt, SamplingParams(max_new_tokens=48, temperature=TEMPERATURE, seed=seed))
        for seed, prompt in enumerate(prompts * 2)
    ]
    generations = await asyncio.gather(*requests)
    trajectories = [
        Trajectory(
            group_id=index % len(prompts),
            prompt_ids=prompt,
            response_ids=generation.completion_ids,
            loss_mask=[1] * len(generation.completion_ids),
            rollout_logprobs=generation.logprobs,
        )
        for index, (prompt, generation) in enumerate(zip(prompts * 2, generations, strict=True))
    ]
    advantages = torch.linspace(-1.0, 1.0, len(trajectories))
    return build_train_batch(trajectories, advantages, pad_token_id=0)


def logprob_gap(worker: PolicyWorker, batch: TrainBatch) -> tuple[float, float]:
    """(mean, max) |trainer logprob - engine logprob| over the sampled tokens."""
    logprobs, _ = worker.compute_logprobs(batch)
    sampled = batch.loss_mask > 0
    gap = (logprobs[sampled] - batch.rollout_logprobs[sampled]).abs()
    return float(gap.mean()), float(gap.max())


@pytest.mark.parametrize("sequence_packing", [True, False], ids=["packed", "padded"])
def test_trainer_bf16_logprobs_of_engine_samples_agree_before_and_after_an_on_device_weight_sync(
    sequence_packing,
):
    async def scenario():
        tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
        prompts = prompt_ids(tokenizer)
        actor = ActorConfig(
            ppo_mini_batch_size=len(prompts), ppo_micro_batch_size_per_gpu=8,
            sequence_packing=sequence_packing, optim={"lr": 1e-3},
        )  # fmt: skip
        worker = PolicyWorker(
            DEFAULT_MODEL_PATH, actor, device="cuda", dtype=torch.bfloat16, temperature=TEMPERATURE
        )
        engine = TransformersEngine.from_pretrained(
            str(DEFAULT_MODEL_PATH), EngineConfig(device="cuda"), dtype=torch.bfloat16, seed=0
        )
        async with engine:
            batch = await sampled_batch(engine, prompts)
            before = logprob_gap(worker, batch)
            batch.old_logprobs, _ = worker.compute_logprobs(batch)
            worker.update(batch)
            # the engine's bf16 weights, straight from the trainer's device: no CPU round trip
            weights = worker.full_state_dict(device=None, dtype=torch.bfloat16)
            assert all(tensor.is_cuda and tensor.dtype == torch.bfloat16 for tensor in weights.values())
            await engine.update_weights(weights, version=1)
            after = logprob_gap(worker, await sampled_batch(engine, prompts))
        return before, after, int(batch.loss_mask.sum())

    (before_mean, before_max), (after_mean, after_max), num_tokens = asyncio.run(scenario())
    print(
        f"\nengine vs trainer, bf16, {num_tokens} sampled tokens, packing={sequence_packing}: "
        f"|diff| mean {before_mean:.5f} max {before_max:.4f}; "
        f"after one update and weight sync: mean {after_mean:.5f} max {after_max:.4f}"
    )
    for mean, largest in ((before_mean, before_max), (after_mean, after_max)):
        assert mean < 0.02
        assert largest < 0.5
