"""Output tokens/s of the built-in engine under many concurrent requests, against baselines.

Requests get varied prompt lengths and varied numbers of new tokens (EOS disabled, so each
produces exactly its budget). Measured in the same run, on the same random-weight model:

- engine: every request submitted at once to `TransformersEngine` (continuous batching);
- baseline: one request at a time through `model.generate()` (a subset of the requests,
  since the rate of a sequential loop does not depend on how many requests it runs);
- optionally, a reference: all requests as one static left-padded `model.generate()` batch,
  which must run every row to the longest budget; only the requested tokens count as output.

CPU:  python benchmarks/engine_throughput.py --model tiny --device cpu
GPU:  python benchmarks/engine_throughput.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 \
          --num-requests 256 --prompt-tokens 64 512 --new-tokens 64 256 --static-reference
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from agentrl.engine import SamplingParams, TransformersEngine

MODEL_SHAPES = {
    # A few-layer model that runs on two CPU cores in seconds.
    "tiny": {
        "vocab_size": 2048, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
    },
    # The shape of Qwen2.5-0.5B (random weights: no model hub is reachable).
    "qwen2.5-0.5b": {
        "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
        "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    },
}  # fmt: skip


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    new_tokens: list[int]


@dataclass(frozen=True)
class Measurement:
    name: str
    num_requests: int
    output_tokens: int
    seconds: float
    num_forward_passes: int  # engine only: prefill + decode passes in the timed region

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.seconds


def build_model(shape: str, device: str, dtype: torch.dtype) -> PreTrainedModel:
    torch.manual_seed(0)
    with torch.device(device):  # random init directly on the device: seconds, not minutes, for 0.5B
        model = Qwen2ForCausalLM(Qwen2Config(**MODEL_SHAPES[shape])).to(dtype).eval()
    model.generation_config.eos_token_id = None  # every request produces exactly its budget
    model.generation_config.pad_token_id = 0
    return model


def make_workload(args: argparse.Namespace, vocab_size: int) -> Workload:
    rng = random.Random(args.seed)
    prompts = [
        [rng.randrange(vocab_size) for _ in range(rng.randint(*args.prompt_tokens))]
        for _ in range(args.num_requests)
    ]
    return Workload(prompts, [rng.randint(*args.new_tokens) for _ in range(args.num_requests)])


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


async def run_engine(model: PreTrainedModel, workload: Workload, args: argparse.Namespace) -> Measurement:
    engine = TransformersEngine(
        model, [], device=args.device, max_batch_size=args.max_batch_size,
        max_prefill_tokens=args.max_prefill_tokens, seed=args.seed,
    )  # fmt: skip
    async with engine:
        # Warm-up: kernels, allocator and the scheduler thread, outside the timed region.
        await asyncio.gather(
            *[engine.generate(p, SamplingParams(max_new_tokens=4)) for p in workload.prompts[:8]]
        )
        synchronize(args.device)
        passes_before = engine.stats.num_prefill_steps + engine.stats.num_decode_steps
        start = time.perf_counter()
        generations = await asyncio.gather(
            *[
                engine.generate(prompt, SamplingParams(max_new_tokens=n, temperature=1.0))
                for prompt, n in zip(workload.prompts, workload.new_tokens, strict=True)
            ]
        )
        synchronize(args.device)
        seconds = time.perf_counter() - start
        num_passes = engine.stats.num_prefill_steps + engine.stats.num_decode_steps - passes_before
    output_tokens = sum(len(g.completion_ids) for g in generations)
    assert output_tokens == sum(workload.new_tokens), "EOS is disabled: every request must fill its budget"
    return Measurement("engine (continuous batching)", len(generations), output_tokens, seconds, num_passes)


def sample_kwargs(max_new_tokens: int) -> dict:
    return {
        "do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
        "max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens,
    }  # fmt: skip


def run_sequential_generate(
    model: PreTrainedModel, workload: Workload, args: argparse.Namespace
) -> Measurement:
    device = args.device
    model.generate(torch.tensor([workload.prompts[0]], device=device), **sample_kwargs(4))  # warm-up
    synchronize(device)
    count = min(args.baseline_requests, len(workload.prompts))
    start = time.perf_counter()
    for prompt, n in zip(workload.prompts[:count], workload.new_tokens[:count], strict=True):
        model.generate(torch.tensor([prompt], device=device), **sample_kwargs(n))
    synchronize(device)
    seconds = time.perf_counter() - start
    num_tokens = sum(workload.new_tokens[:count])
    return Measurement("baseline: generate() one request at a time", count, num_tokens, seconds, num_tokens)


def run_static_generate(model: PreTrainedModel, workload: Workload, args: argparse.Namespace) -> Measurement:
    width = max(len(p) for p in workload.prompts)
    input_ids = torch.zeros((len(workload.prompts), width), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, prompt in enumerate(workload.prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt) :] = 1
    input_ids, attention_mask = input_ids.to(args.device), attention_mask.to(args.device)
    synchronize(args.device)
    start = time.perf_counter()
    model.generate(
        input_ids=input_ids, attention_mask=attention_mask, **sample_kwargs(max(workload.new_tokens))
    )
    synchronize(args.device)
    seconds = time.perf_counter() - start
    # The static batch runs every row to the longest budget; only requested tokens are output.
    num_passes = max(workload.new_tokens)
    name = "reference: one static generate() batch"
    return Measurement(name, len(workload.prompts), sum(workload.new_tokens), seconds, num_passes)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODEL_SHAPES), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, nargs=2, default=[8, 64], metavar=("MIN", "MAX"))
    parser.add_argument("--new-tokens", type=int, nargs=2, default=[8, 48], metavar=("MIN", "MAX"))
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--max-prefill-tokens", type=int, default=32768)
    parser.add_argument(
        "--baseline-requests", type=int, default=8, help="requests timed in the sequential loop"
    )
    parser.add_argument(
        "--static-reference", action="store_true", help="also time one static generate() batch"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the measurements to this file")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    model = build_model(args.model, args.device, getattr(torch, args.dtype))
    workload = make_workload(args, model.config.vocab_size)
    engine = asyncio.run(run_engine(model, workload, args))
    baseline = run_sequential_generate(model, workload, args)
    measurements = [baseline, engine]
    if args.static_reference:
        measurements.append(run_static_generate(model, workload, args))
    print(f"model={args.model} device={args.device} dtype={args.dtype} requests={args.num_requests} "
          f"prompt_tokens={args.prompt_tokens} new_tokens={args.new_tokens}")  # fmt: skip
    for m in measurements:
        print(f"{m.name:45s} {m.num_requests:5d} requests {m.output_tokens:8d} tokens "
              f"{m.seconds:8.2f} s {m.tokens_per_second:10.1f} tokens/s {m.num_forward_passes:6d} passes")  # fmt: skip
    print(f"ratio engine / baseline: {engine.tokens_per_second / baseline.tokens_per_second:.2f}x")
    if args.static_reference:
        print(
            f"ratio engine / static reference: {engine.tokens_per_second / measurements[2].tokens_per_second:.2f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "measurements": [asdict(m) | {"tokens_per_second": m.tokens_per_second}
                                                            for m in measurements]}, f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
