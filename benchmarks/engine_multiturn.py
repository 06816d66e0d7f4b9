"""Output tokens/s on a multi-turn GRPO workload: the engine with and without its prefix cache.

Episodes come in groups of `--group-size` that share their first prompt. Each episode runs
`--turns` turns: the engine completes the conversation so far, then an observation of random
tokens is appended, and the next turn's prompt is the whole history (as the agent loop builds
it). EOS is disabled, so every turn produces exactly its budget. Measured in the same run, on
the same random-weight model:

- engine, prefix cache on: every episode is its own task, all running at once;
- engine, prefix cache off: the same, every prompt prefilled in full;
- baseline: transformers `generate()`, one static left-padded batch of all episodes per turn
  (each batch runs to its longest budget; only the requested tokens count as output).

Each engine runs a warm-up round with other seeds first; with `--repeats N` it then times N
rounds, each from an empty prefix cache, and reports the median one.

The memory roofline is that of the cached engine's decode steps (see engine_throughput.py).

CPU:  python benchmarks/engine_multiturn.py --model tiny --device cpu
GPU:  python benchmarks/engine_multiturn.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 \
          --num-requests 256 --prompt-tokens 64 512 --new-tokens 64 256 --repeats 5
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from engine_throughput import (
    Measurement,
    build_model,
    build_parser,
    kv_positions_read,
    median_round,
    open_engine,
    parse_args,
    print_roofline,
    profiler_of,
    roofline_of,
    sample_kwargs,
    save_checkpoint,
    synchronize,
)
from kernel_profile import format_profile
from transformers import PreTrainedModel

from agentrl.engine import SamplingParams
from agentrl.engine.builtin.model.model_setup import attention_backends
from agentrl.engine.config import ModelConfig


@dataclass(frozen=True)
class Episodes:
    """Every episode's first prompt, per-turn budgets and observations (fixed before any run)."""

    first_prompts: list[list[int]]  # [num_episodes][prompt tokens]; equal within a group
    new_tokens: list[list[int]]  # [num_episodes][num_turns]
    observations: list[list[list[int]]]  # [num_episodes][num_turns - 1][observation tokens]


@dataclass(frozen=True)
class Transcript:
    """What one run did: prompt lengths and budgets of every generate call, in any order."""

    prompt_lengths: list[int]
    new_tokens: list[int]


def make_episodes(args, vocab_size: int) -> Episodes:
    rng = random.Random(args.seed)
    if args.num_requests % args.group_size:
        raise ValueError(
            f"--num-requests={args.num_requests} must be a multiple of --group-size={args.group_size}"
        )
    first_prompts = []
    for _ in range(args.num_requests // args.group_size):
        prompt = [rng.randrange(vocab_size) for _ in range(rng.randint(*args.prompt_tokens))]
        first_prompts += [prompt] * args.group_size
    new_tokens = [[rng.randint(*args.new_tokens) for _ in range(args.turns)] for _ in first_prompts]
    observations = [
        [[rng.randrange(vocab_size) for _ in range(rng.randint(*args.observation_tokens))] for _ in range(args.turns - 1)]
        for _ in first_prompts
    ]  # fmt: skip
    return Episodes(first_prompts, new_tokens, observations)


async def run_engine(
    checkpoint: ModelConfig, episodes: Episodes, args, prefix_cache: bool
) -> tuple[Measurement, Transcript]:
    async with open_engine(checkpoint, args, prefix_cache) as engine:
        transcript = Transcript([], [])

        async def episode(index: int, seed: int, record: bool) -> int:
            prompt, produced = list(episodes.first_prompts[index]), 0
            for turn, budget in enumerate(episodes.new_tokens[index]):
                if record:
                    transcript.prompt_lengths.append(len(prompt))
                    transcript.new_tokens.append(budget)
                params = SamplingParams(max_new_tokens=budget, temperature=1.0, seed=seed + turn)
                generation = await engine.generate(prompt, params)
                produced += len(generation.completion_ids)
                prompt += generation.completion_ids
                if turn < len(episodes.observations[index]):
                    prompt += episodes.observations[index][turn]
            return produced

        async def run_once(seed: int, record: bool = False) -> int:
            return sum(
                await asyncio.gather(
                    *[episode(i, seed + 100 * i, record) for i in range(len(episodes.first_prompts))]
                )
            )

        name = f"engine, prefix cache {'on' if prefix_cache else 'off'}"

        async def timed_round(record: bool) -> tuple[Measurement, int, int]:
            """(the round, its prompt tokens, those read from the prefix cache), from an empty cache."""
            if engine.prefix_cache is not None:
                engine.prefix_cache.clear()
            synchronize(args.device)
            stats = engine.stats
            passes, decodes = stats.num_prefill_steps + stats.num_decode_steps, stats.num_decode_steps
            prompt_tokens, cached_tokens = stats.num_prompt_tokens, stats.num_prefix_cached_tokens
            start = time.perf_counter()
            output_tokens = await run_once(seed=args.seed, record=record)
            synchronize(args.device)
            seconds = time.perf_counter() - start
            assert output_tokens == sum(map(sum, episodes.new_tokens)), (
                "EOS is disabled: every turn fills its budget"
            )
            measurement = Measurement(
                name, len(episodes.first_prompts) * len(episodes.new_tokens[0]), output_tokens, seconds,
                stats.num_prefill_steps + stats.num_decode_steps - passes, stats.num_decode_steps - decodes,
            )  # fmt: skip
            return (
                measurement,
                stats.num_prompt_tokens - prompt_tokens,
                stats.num_prefix_cached_tokens - cached_tokens,
            )

        # Warm-up with other seeds: kernels and CUDA graph buckets; each timed round starts from an
        # empty prefix cache and runs the same episodes.
        await run_once(seed=10**6)
        rounds = [await timed_round(record=index == 0) for index in range(args.repeats)]
        if (profiler := profiler_of(args)) is not None:  # the same episodes again, on an emptied prefix cache
            if engine.prefix_cache is not None:
                engine.prefix_cache.clear()
            with profiler as region:
                await run_once(seed=args.seed)
            print(f"{name}, the episodes once more:")
            print(format_profile(region.result))
    _, prompt_tokens, cached_tokens = rounds[0]
    print(f"{name}: {cached_tokens:,} of {prompt_tokens:,} prompt tokens read from the prefix cache "
          f"({cached_tokens / prompt_tokens:.1%})")  # fmt: skip
    return median_round([measurement for measurement, _, _ in rounds]), transcript


def run_static_generate(model: PreTrainedModel, episodes: Episodes, args) -> Measurement:
    """One left-padded `generate()` batch of all episodes per turn; rows keep their own budget."""
    torch.manual_seed(args.seed)  # generate() samples from the global generator
    prompts = [list(p) for p in episodes.first_prompts]
    num_turns = len(episodes.new_tokens[0])
    synchronize(args.device)
    start, output_tokens = time.perf_counter(), 0
    for turn in range(num_turns):
        budgets = [tokens[turn] for tokens in episodes.new_tokens]
        width = max(len(p) for p in prompts)
        input_ids = torch.zeros((len(prompts), width), dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt) :] = 1
        # Off cuDNN as the engine is: with a padding mask cuDNN SDPA rebuilds a graph at every step.
        with attention_backends(torch.device(args.device)):
            output = model.generate(
                input_ids=input_ids.to(args.device), attention_mask=attention_mask.to(args.device),
                **sample_kwargs(max(budgets)),
            )  # fmt: skip
        completions = output[:, width:].tolist()
        for row, budget in enumerate(budgets):
            prompts[row] += completions[row][:budget]
            output_tokens += budget
            if turn < num_turns - 1:
                prompts[row] += episodes.observations[row][turn]
    synchronize(args.device)
    seconds = time.perf_counter() - start
    name = "baseline: static generate() batch per turn"
    return Measurement(name, len(prompts) * num_turns, output_tokens, seconds, num_turns)


def main() -> None:
    parser = build_parser(__doc__.split("\n")[0])
    parser.add_argument("--group-size", type=int, default=8, help="episodes sharing a first prompt")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--observation-tokens", type=int, nargs=2, default=[8, 32], metavar=("MIN", "MAX"))
    args = parse_args(parser)
    model = build_model(args.model, args.device, getattr(torch, args.dtype))
    roofline = roofline_of(model, args.device)
    episodes = make_episodes(args, model.config.vocab_size)
    with tempfile.TemporaryDirectory(prefix="engine-benchmark-") as directory:
        checkpoint = save_checkpoint(model, Path(directory), args.dtype)
        cached, transcript = asyncio.run(run_engine(checkpoint, episodes, args, prefix_cache=True))
        uncached, _ = asyncio.run(run_engine(checkpoint, episodes, args, prefix_cache=False))
    static = run_static_generate(model, episodes, args)
    print(f"model={args.model} device={args.device} dtype={args.dtype} episodes={args.num_requests} "
          f"group_size={args.group_size} turns={args.turns} prompt_tokens={args.prompt_tokens} "
          f"new_tokens={args.new_tokens} observation_tokens={args.observation_tokens}")  # fmt: skip
    for m in (static, uncached, cached):
        print(f"{m.name:45s} {m.num_requests:5d} calls {m.output_tokens:8d} tokens "
              f"{m.seconds:8.2f} s {m.tokens_per_second:10.1f} tokens/s {m.num_forward_passes:6d} passes")  # fmt: skip
    print(f"ratio prefix cache on / off: {cached.tokens_per_second / uncached.tokens_per_second:.2f}x")
    print(
        f"ratio prefix cache on / static generate(): {cached.tokens_per_second / static.tokens_per_second:.2f}x"
    )
    print_roofline(roofline, cached, kv_positions_read(transcript.prompt_lengths, transcript.new_tokens))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "measurements": [asdict(m) | {"tokens_per_second": m.tokens_per_second}
                                                            for m in (static, uncached, cached)]}, f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
