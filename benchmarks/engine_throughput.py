"""Output tokens/s of the built-in engine under many concurrent requests, against baselines.

Requests get varied prompt lengths and varied numbers of new tokens (EOS disabled, so each
produces exactly its budget). Measured in the same run, on the same random-weight model:

- engine: every request submitted at once to the built-in engine (continuous batching), after a
  warm-up round; with `--repeats N`, N timed rounds, the median one reported. It is built as a
  run builds it (`build_engine`, from the engine flags and the model saved to a temporary
  checkpoint), so it serves its own copy of the weights;
- baseline: one request at a time through `model.generate()` (a subset of the requests,
  since the rate of a sequential loop does not depend on how many requests it runs);
- optionally, a reference: all requests as one static left-padded `model.generate()` batch,
  which must run every row to the longest budget; only the requested tokens count as output.

It also prints the memory roofline of the engine's run: each decode step must read every weight
once and the keys/values of every running row, at the device-to-device copy bandwidth measured
in the same run (bytes read + written per second); the floor is those bytes over that bandwidth,
summed over the decode steps the engine actually ran. Last, it times weight sync: `update_weights`
with the model's own state dict already on the device, as many times as the rounds.

CPU:  python benchmarks/engine_throughput.py --model tiny --device cpu
GPU:  python benchmarks/engine_throughput.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 \
          --num-requests 256 --prompt-tokens 64 512 --new-tokens 64 256 --repeats 5 --static-reference
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from kernel_profile import Profiled, format_profile
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from agentrl.devices import resolve_device
from agentrl.engine import SamplingParams, TransformersEngine
from agentrl.engine.builtin.model.model_setup import attention_backends, slot_shape
from agentrl.engine.config import ModelConfig, add_engine_flags, engine_config_from_flags
from agentrl.engine.factory import build_engine

MODEL_SHAPES = {  # each a transformers config (`model_type` names its family); random weights
    # A few-layer model that runs on two CPU cores in seconds.
    "tiny": {
        "model_type": "qwen2", "vocab_size": 2048, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
    },
    # The shape of Qwen2.5-0.5B (random weights: no model hub is reachable).
    "qwen2.5-0.5b": {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
        "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    },
    "qwen2.5-1.5b": {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
        "num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 32768,
        "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    },
    # Qwen3-0.6B: QK-norm, and 16 heads of 128 (2,048 attention features from a hidden size of 1,024).
    "qwen3-0.6b": {
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 40960, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
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
    num_decode_steps: int = 0  # engine only: decode passes in the timed region

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.seconds


def build_model(shape: str, device: str, dtype: torch.dtype) -> PreTrainedModel:
    torch.manual_seed(0)
    config = AutoConfig.for_model(**MODEL_SHAPES[shape])
    with torch.device(device):  # random init directly on the device: seconds, not minutes, for 0.5B
        model = AutoModelForCausalLM.from_config(config).to(dtype).eval()
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


@dataclass(frozen=True)
class Roofline:
    """What a decode step must move through device memory, and how fast this device moves it."""

    weight_bytes: int  # every parameter once (tied matrices once)
    kv_bytes_per_token: int  # keys + values of one position, all layers
    copy_bytes_per_second: float  # measured device-to-device copy, bytes read + written

    def tokens_per_second(self, output_tokens: int, num_decode_steps: int, kv_positions_read: int) -> float:
        """Output tokens over the time to read the weights each step and every row's keys/values."""
        floor_bytes = num_decode_steps * self.weight_bytes + kv_positions_read * self.kv_bytes_per_token
        return output_tokens / (floor_bytes / self.copy_bytes_per_second)


def measure_copy_bandwidth(device: str, num_bytes: int = 1 << 30, repeats: int = 10) -> float:
    """Bytes read + written per second by a large device-to-device tensor copy."""
    source = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    target.copy_(source)  # warm-up
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        target.copy_(source)
    synchronize(device)
    return 2 * num_bytes * repeats / (time.perf_counter() - start)


def roofline_of(model: PreTrainedModel, device: str) -> Roofline:
    config = model.config
    head_dim = slot_shape(model)["head_dim"]  # Qwen3's is explicit: not hidden_size // heads
    itemsize = next(model.parameters()).element_size()
    return Roofline(
        weight_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
        kv_bytes_per_token=2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * itemsize,
        copy_bytes_per_second=measure_copy_bandwidth(
            device, num_bytes=(1 << 30) if device != "cpu" else 1 << 27
        ),
    )


def kv_positions_read(prompt_lengths: Sequence[int], new_tokens: Sequence[int]) -> int:
    """Cached positions read by decode: the k-th decode step of a request reads prompt + k of them."""
    return sum(p * (n - 1) + n * (n - 1) // 2 for p, n in zip(prompt_lengths, new_tokens, strict=True))


def save_checkpoint(model: PreTrainedModel, directory: Path, dtype: str) -> ModelConfig:
    """`model` saved as a checkpoint `build_engine` loads, with a tokenizer that names no EOS."""
    model.save_pretrained(directory)
    vocabulary = Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>"))
    # An EOS named null: left out, transformers would give the model type's tokenizer its default EOS.
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=vocabulary, unk_token="<unk>", eos_token=None)
    tokenizer.save_pretrained(directory)
    return ModelConfig(path=str(directory), dtype=dtype)


def open_engine(checkpoint: ModelConfig, args: argparse.Namespace, prefix_cache: bool) -> TransformersEngine:
    """The built-in engine the engine flags describe (`prefix_cache=False`: its prefix cache off)."""
    config = engine_config_from_flags(args)
    if not prefix_cache:
        config = config.model_copy(update={"prefix_cache_bytes": 0})
    engine = build_engine(checkpoint, config, seed=args.seed)
    assert not engine.eos_ids, f"EOS must be disabled, but the engine stops at {sorted(engine.eos_ids)}"
    return engine


async def run_engine(
    checkpoint: ModelConfig, model: PreTrainedModel, workload: Workload, args: argparse.Namespace
) -> Measurement:
    # The prefix cache stays off: a rerun of the same prompts would hit it and measure less work.
    async with open_engine(checkpoint, args, prefix_cache=False) as engine:

        async def run_once() -> list:
            return await asyncio.gather(
                *[
                    engine.generate(prompt, SamplingParams(max_new_tokens=n, temperature=1.0))
                    for prompt, n in zip(workload.prompts, workload.new_tokens, strict=True)
                ]
            )

        async def timed_round() -> Measurement:
            passes_before = engine.stats.num_prefill_steps + engine.stats.num_decode_steps
            decodes_before = engine.stats.num_decode_steps
            start = time.perf_counter()
            generations = await run_once()
            synchronize(args.device)
            seconds = time.perf_counter() - start
            output_tokens = sum(len(g.completion_ids) for g in generations)
            assert output_tokens == sum(workload.new_tokens), (
                "EOS is disabled: every request must fill its budget"
            )
            num_passes = engine.stats.num_prefill_steps + engine.stats.num_decode_steps - passes_before
            num_decodes = engine.stats.num_decode_steps - decodes_before
            name = "engine (continuous batching)"
            return Measurement(name, len(generations), output_tokens, seconds, num_passes, num_decodes)

        # Warm-up: the whole workload once, so kernels, the allocator and every CUDA graph bucket
        # it needs are ready before the timed rounds.
        await run_once()
        synchronize(args.device)
        rounds = [await timed_round() for _ in range(args.repeats)]
        if (profiler := profiler_of(args)) is not None:
            with profiler as region:
                await run_once()
            print(f"engine, the workload once more:\n{format_profile(region.result)}")
        await time_weight_sync(engine, model, args.repeats)
    return median_round(rounds)


def median_round(rounds: list[Measurement]) -> Measurement:
    """The round of median time (of two middle ones, the slower); with several, prints every round's speed."""
    if len(rounds) > 1:
        speeds = ", ".join(f"{m.tokens_per_second:,.0f}" for m in rounds)
        print(
            f"{rounds[0].name}: {len(rounds)} timed rounds at {speeds} tokens/s; the median round is reported"
        )
    return sorted(rounds, key=lambda m: m.seconds)[len(rounds) // 2]


async def time_weight_sync(engine: TransformersEngine, model: PreTrainedModel, repeats: int) -> None:
    """Time `update_weights` with a full state dict already on the engine's device and dtype, `repeats` times.

    One update is one sample of a few milliseconds, which a pause anywhere on the host can
    multiply; with several, the median and the range are printed.
    """
    state_dict = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    num_bytes = sum(t.numel() * t.element_size() for t in state_dict.values())
    end_to_end, copying = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        await engine.update_weights(state_dict, version=engine.policy_version + 1)
        end_to_end.append(time.perf_counter() - start)
        copying.append(engine.stats.weight_sync_seconds)
    what = f"{repeats} updates, median" if repeats > 1 else "one update"
    print(f"weight sync: {num_bytes / 1e9:.3f} GB state dict on {engine.device}, {what}: "
          f"{milliseconds(end_to_end)} end to end, {milliseconds(copying)} copying in place")  # fmt: skip


def milliseconds(samples: list[float]) -> str:
    """The median of `samples` (seconds) in ms, with their range when there are several."""
    median = sorted(samples)[len(samples) // 2] * 1e3
    if len(samples) == 1:
        return f"{median:.1f} ms"
    return f"{median:.1f} ms ({min(samples) * 1e3:.1f}-{max(samples) * 1e3:.1f})"


def sample_kwargs(max_new_tokens: int) -> dict:
    return {
        "do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
        "max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens,
    }  # fmt: skip


def run_sequential_generate(
    model: PreTrainedModel, workload: Workload, args: argparse.Namespace
) -> Measurement:
    device = args.device
    with attention_backends(torch.device(device)):  # the engine's SDPA backends, for a like comparison
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
    # Off cuDNN as the engine is: with a padding mask cuDNN SDPA rebuilds a graph at every step.
    with attention_backends(torch.device(args.device)):
        model.generate(
            input_ids=input_ids, attention_mask=attention_mask, **sample_kwargs(max(workload.new_tokens))
        )
    synchronize(args.device)
    seconds = time.perf_counter() - start
    # The static batch runs every row to the longest budget; only requested tokens are output.
    num_passes = max(workload.new_tokens)
    name = "reference: one static generate() batch"
    return Measurement(name, len(workload.prompts), sum(workload.new_tokens), seconds, num_passes)


def profiler_of(args: argparse.Namespace) -> Profiled | None:
    """The profiler of the extra round `--profile` or `--profile-host` asks for; None without either."""
    if not (args.profile or args.profile_host):
        return None
    return Profiled(torch.device(args.device), host_stacks=args.profile_host)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def build_parser(description: str) -> argparse.ArgumentParser:
    """The flags both engine benchmarks share."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", choices=sorted(MODEL_SHAPES), default="tiny")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, nargs=2, default=[8, 64], metavar=("MIN", "MAX"))
    parser.add_argument("--new-tokens", type=int, nargs=2, default=[8, 48], metavar=("MIN", "MAX"))
    parser.add_argument(
        "--baseline-requests", type=int, default=8, help="requests timed in the sequential loop"
    )
    parser.add_argument(
        "--static-reference", action="store_true", help="also time one static generate() batch"
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=1,
        help="engine: timed rounds after the warm-up round, each the whole workload; the median round is "
        "reported and every round's tokens/s printed (baselines run once)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the measurements to this file")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the timed engine run, one more under torch.profiler: kernel time by kind, longest "
        "kernels, idle gaps (benchmarks/kernel_profile.py)",
    )
    parser.add_argument(
        "--profile-host",
        action="store_true",
        help="--profile, also recording the host's Python calls: adds which project code each thread ran "
        "while the GPU idled (the recording slows the host, so the gaps grow)",
    )
    add_engine_flags(parser)  # --device, --max-batch-size, --no-cuda-graphs, ...: the engine's knobs
    # The benchmark's own defaults: every request in one batch and one prefill pass, on the CPU unless asked.
    parser.set_defaults(
        device="cpu", max_batch_size=256, max_prefill_tokens=32768, prefix_cache_bytes=8 << 30
    )
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, with --device resolved (auto: cuda where available)."""
    args = parser.parse_args(argv)
    args.device = resolve_device(args.device, "--device")
    return args


def print_roofline(roofline: Roofline, engine: Measurement, kv_read: int) -> None:
    ceiling = roofline.tokens_per_second(engine.output_tokens, engine.num_decode_steps, kv_read)
    rows = engine.output_tokens / max(engine.num_decode_steps, 1)
    print(
        f"memory roofline: {roofline.weight_bytes / 1e9:.3f} GB weights + {roofline.kv_bytes_per_token} B KV/token, "
        f"{rows:.0f} rows per decode step, {roofline.copy_bytes_per_second / 1e9:,.0f} GB/s measured copy: "
        f"{ceiling:,.0f} tokens/s; engine at {engine.tokens_per_second / ceiling:.1%} of it"
    )


def main() -> None:
    args = parse_args(build_parser(__doc__.split("\n")[0]))
    model = build_model(args.model, args.device, getattr(torch, args.dtype))
    roofline = roofline_of(model, args.device)
    workload = make_workload(args, model.config.vocab_size)
    with tempfile.TemporaryDirectory(prefix="engine-benchmark-") as directory:
        checkpoint = save_checkpoint(model, Path(directory), args.dtype)
        engine = asyncio.run(run_engine(checkpoint, model, workload, args))
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
    print_roofline(
        roofline, engine, kv_positions_read([len(p) for p in workload.prompts], workload.new_tokens)
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "measurements": [asdict(m) | {"tokens_per_second": m.tokens_per_second}
                                                            for m in measurements]}, f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
