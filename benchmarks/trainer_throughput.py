"""Training throughput of the real PolicyWorker: one PPO update of long sequences, against the previous path.

Random-weight models of Qwen2.5 shapes (built from a config, no download) take one optimizer
step on `--num-sequences` sequences of `--sequence-length` tokens (a `--prompt-tokens` prompt
and a sampled response). Measured in the same run, on the same model and batch:

- previous: the trainer as it was, the model's own forward with logits at every position,
  a float32 log_softmax and an entropy over all of them, right-padded micro-batches;
- chunked: the language-model head applied to the response positions only, in chunks,
  sequences packed into one row with per-sequence causal attention;
- chunked + checkpointing: the same with activation checkpointing, at the presets'
  micro-batch size;
- compiled: each of the two above with `actor.use_torch_compile` (each decoder layer's forward
  and the head's per-chunk kernels compiled).

Updates are timed after `--warmup` untimed ones. The first compiles, and the next few after any
compile run slower while Inductor's compile worker processes wind down (an H100 host, 0.5B:
908-996 ms an update for three updates, then 707-711 ms); training runs for hours past that.

With `--varied-lengths` each sequence's length is drawn uniformly up to `--sequence-length`
and every update gets a new batch, as in training: kernels that set up per shape pay for it.
Compiled layers then still compile once more, at whichever update first brings a micro-batch
on the other side of a size threshold Inductor chose (4,096 tokens on an H100): a one-off cost
in a run of thousands of updates, but seconds inside a handful of timed ones. Timed updates
during which dynamo compiled are therefore left out of tokens/s and MFU, and counted.

Printed per variant: tokens/s of `update()` over the timed updates that compiled nothing
(every real token of every sequence, prompt included; padding not counted), MFU, peak GPU
memory, the ratio to the previous path, how many timed updates compiled (left out), and how
many times the CUDA caching allocator ran out, freed its cache and retried in the timed updates.

MFU counts model FLOPs only (no recompute): 6 x decoder matmul parameters per token, 6 x layers
x hidden x sequence length per token for causal attention, and 6 x hidden x vocabulary per
scored token for the head. It is given against the datasheet bf16 peak (`--peak-tflops`) and
against a bf16 matmul measured in the same run.

GPU:  python benchmarks/trainer_throughput.py --shapes qwen2.5-0.5b qwen2.5-1.5b [--varied-lengths] [--profile]

Under torchrun every rank runs the same variants as one FSDP2 group, each updating its share of
the batch; rank 0 prints tokens/s of the whole group and MFU per GPU. One rank against two on
one host (`--variants` keeps the comparison to the presets' variant):

    python benchmarks/trainer_throughput.py --shapes qwen2.5-1.5b --variants checkpointing
    torchrun --nproc_per_node=2 benchmarks/trainer_throughput.py --shapes qwen2.5-1.5b --variants checkpointing
CPU:  python benchmarks/trainer_throughput.py --shapes tiny --device cpu --dtype float32 \\
          --num-sequences 4 --sequence-length 64 --prompt-tokens 16 --micro-batch 2
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from kernel_profile import KernelProfile, Profiled, format_profile
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentrl.trainer.actor_config import ActorConfig
from agentrl.trainer.batch import TrainBatch
from agentrl.trainer.loss import TokenLoss
from agentrl.trainer.packing import ScoringInputs
from agentrl.trainer.policy_worker import PolicyWorker
from agentrl.trainer.scorer import CausalLMScorer
from agentrl.trainer.token_logprobs import TokenScores

MODEL_SHAPES = {
    "tiny": {
        "vocab_size": 2048, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True,
    },
    "qwen2.5-0.5b": {
        "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True,
    },
    "qwen2.5-1.5b": {
        "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
        "num_attention_heads": 12, "num_key_value_heads": 2, "tie_word_embeddings": True,
    },
}  # fmt: skip
# Largest micro-batches of 4,096-token sequences that fit on an 80 GB card without checkpointing,
# for the previous path (as measured before this change), the chunked one and the compiled one.
PREVIOUS_MICRO_BATCH = {"tiny": 2, "qwen2.5-0.5b": 4, "qwen2.5-1.5b": 2}
CHUNKED_MICRO_BATCH = {"tiny": 2, "qwen2.5-0.5b": 8, "qwen2.5-1.5b": 2}
COMPILED_MICRO_BATCH = {"tiny": 2, "qwen2.5-0.5b": 16, "qwen2.5-1.5b": 4}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


class FullLogitsScorer(CausalLMScorer):
    """The previous path: logits, float32 log-probs and entropy at every position of a padded batch.

    The loss, when given, is taken on those logprobs, and autograd runs back through all of them.
    """

    def forward(
        self, inputs: ScoringInputs, with_entropy: bool, loss: TokenLoss | None = None
    ) -> tuple[TokenScores, torch.Tensor | None]:
        logits = self.model(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            position_ids=inputs.position_ids,
            use_cache=False,
        ).logits
        log_probs = F.log_softmax(logits[:, :-1].float() / self.temperature, dim=-1)  # [B, T-1, V]
        token_logprobs = log_probs.gather(-1, inputs.input_ids[:, 1:, None]).squeeze(-1)
        # It computed the entropy whether or not anything used it (with gradient only when used).
        with torch.set_grad_enabled(with_entropy and torch.is_grad_enabled()):
            entropy = -(log_probs.exp() * log_probs).sum(-1)
        rows, predictors = inputs.rows, inputs.positions - 1
        scores = TokenScores(
            token_logprobs[rows, predictors], entropy[rows, predictors] if with_entropy else None
        )
        if loss is None:
            return scores, None
        value = loss(slice(None), scores.logprobs, scores.entropy)
        detached = None if scores.entropy is None else scores.entropy.detach()
        return TokenScores(scores.logprobs.detach(), detached), value


class PreviousPolicyWorker(PolicyWorker):
    scorer_class = FullLogitsScorer


@dataclass
class Variant:
    name: str
    micro_batch_size: int
    chunked: bool
    gradient_checkpointing: bool
    compiled: bool = False  # actor.use_torch_compile


@dataclass
class Result:
    variant: Variant
    tokens_per_s: float | None  # real (not padding) tokens; None: out of memory, or every update compiled
    peak_gib: float | None
    flops_per_s: float | None = None  # model FLOPs (module doc)
    compiling_updates: int = 0  # timed updates left out because dynamo compiled during them
    alloc_retries: int = 0  # times the CUDA allocator freed its cache to retry, timed updates
    profile: KernelProfile | None = None  # one more update under the profiler (--profile)


def write_random_model(
    shape: str, directory: Path, device: torch.device, sequence_length: int
) -> Qwen2Config:
    config = Qwen2Config(
        **MODEL_SHAPES[shape], max_position_embeddings=max(32768, sequence_length),
        rope_theta=1_000_000.0, rms_norm_eps=1e-6,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    del model
    return config


def random_batch(args: argparse.Namespace, vocab_size: int, seed: int = 0) -> TrainBatch:
    """Sequences each in its own group, with the loss on every response token.

    All `--sequence-length` long, or with `--varied-lengths` each of a length drawn uniformly
    from (prompt, sequence length], right padded: a new set of lengths for every seed.
    """
    shape = (args.num_sequences, args.sequence_length)
    generator = torch.Generator().manual_seed(seed)
    if args.varied_lengths:
        lengths = torch.randint(
            args.prompt_tokens + 1, args.sequence_length + 1, (args.num_sequences,), generator=generator
        )
    else:
        lengths = torch.full((args.num_sequences,), args.sequence_length)
    attention_mask = (torch.arange(args.sequence_length) < lengths[:, None]).long()
    loss_mask = attention_mask.float()
    loss_mask[:, : args.prompt_tokens] = 0.0
    advantages = torch.randn(args.num_sequences, 1, generator=generator).sign()
    return TrainBatch(
        input_ids=torch.randint(3, vocab_size, shape, generator=generator) * attention_mask,
        attention_mask=attention_mask,
        position_ids=torch.arange(args.sequence_length).expand(shape).clone(),
        loss_mask=loss_mask,
        advantages=advantages * loss_mask,
        rollout_logprobs=torch.zeros(shape),
        group_ids=torch.arange(args.num_sequences),
        episode_ids=torch.arange(args.num_sequences),
    )


def model_flops(config: Qwen2Config, batch: TrainBatch) -> float:
    """Forward + backward FLOPs of one update, without recompute (formula in the module doc)."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    kv_width = config.num_key_value_heads * hidden // config.num_attention_heads
    matmul_params_per_layer = (
        2 * hidden * hidden + 2 * hidden * kv_width + 3 * hidden * config.intermediate_size
    )
    lengths = batch.attention_mask.sum(dim=-1).double()
    num_tokens = float(lengths.sum())
    decoder = 6 * layers * matmul_params_per_layer * num_tokens
    attention = 6 * layers * hidden * float((lengths**2).sum())  # each token attends to its sequence
    head = 6 * hidden * config.vocab_size * float(batch.loss_mask.sum())
    return float(decoder + attention + head)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measured_matmul_tflops(device: torch.device, dtype: torch.dtype, size: int = 8192) -> float:
    """Median bf16 (or `dtype`) TFLOP/s of a size^3 matrix product on random data."""
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    times = []
    for _ in range(12):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * size**3 / sorted(times[2:])[len(times[2:]) // 2] / 1e12


def run_variant(
    args: argparse.Namespace,
    model_dir: Path,
    variant: Variant,
    batches: list[TrainBatch],  # warm-up batches, then the timed ones
    num_warmup: int,
    flops: list[float],  # model FLOPs of each batch
    device: torch.device,
) -> Result:
    actor = ActorConfig(
        ppo_mini_batch_size=args.num_sequences,
        ppo_micro_batch_size_per_gpu=variant.micro_batch_size,
        sequence_packing=variant.chunked,
        gradient_checkpointing=variant.gradient_checkpointing,
        use_torch_compile=variant.compiled,
        optim={"lr": 1e-6},
    )
    worker_class = PolicyWorker if variant.chunked else PreviousPolicyWorker
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    worker = None
    try:
        worker = worker_class(model_dir, actor, device=device, dtype=DTYPES[args.dtype])
        for batch in batches:
            batch.old_logprobs, _ = worker.compute_logprobs(batch)
        for batch in batches[:num_warmup]:
            worker.update(batch)  # allocator, kernels, optimizer state, compilation
        retries = _alloc_retries(device)
        steady = []  # (seconds, batch index) of each timed update that compiled nothing
        for index in range(num_warmup, len(batches)):
            frames = _compiled_frames()
            synchronize(device)
            start = time.perf_counter()
            worker.update(batches[index])
            synchronize(device)
            if _compiled_frames() == frames:
                steady.append((time.perf_counter() - start, index))
        retries = _alloc_retries(device) - retries
        profile = None
        if args.profile:
            with Profiled(device) as region:
                worker.update(batches[-1])
            profile = region.result
    except torch.OutOfMemoryError:
        return Result(variant, None, None)
    finally:
        del worker
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    compiling = len(batches) - num_warmup - len(steady)
    if not steady:
        return Result(variant, None, peak, None, compiling, retries, profile)
    seconds = sum(elapsed for elapsed, _ in steady)
    tokens = sum(float(batches[index].attention_mask.sum()) for _, index in steady)
    steady_flops = sum(flops[index] for _, index in steady)
    return Result(variant, tokens / seconds, peak, steady_flops / seconds, compiling, retries, profile)


def _compiled_frames() -> int:
    return torch._dynamo.utils.counters["frames"]["total"]


def _alloc_retries(device: torch.device) -> int:
    return torch.cuda.memory_stats(device).get("num_alloc_retries", 0) if device.type == "cuda" else 0


def benchmark_shape(args: argparse.Namespace, shape: str, device: torch.device, matmul_tflops: float) -> None:
    every_variant = {
        "previous": Variant("previous: full logits, padded", PREVIOUS_MICRO_BATCH[shape], False, False),
        "chunked": Variant("chunked head, packed", CHUNKED_MICRO_BATCH[shape], True, False),
        "checkpointing": Variant("chunked head, packed, checkpointing", args.micro_batch, True, True),
        "compiled": Variant("chunked head, packed, compiled", COMPILED_MICRO_BATCH[shape], True, False, True),
        "checkpointing-compiled": Variant(
            "chunked head, packed, checkpointing, compiled", args.micro_batch, True, True, True
        ),
    }
    variants = [every_variant[key] for key in args.variants]
    with tempfile.TemporaryDirectory() as directory:
        config = write_random_model(shape, Path(directory), device, args.sequence_length)
        num_warmup = args.warmup
        if args.varied_lengths:
            # Every update sees new lengths, as in training; the second warm-up update is the
            # first with another token count (compiled variants recompile for it once).
            batches = [random_batch(args, config.vocab_size, seed) for seed in range(num_warmup + args.steps)]
        else:
            batches = [random_batch(args, config.vocab_size)] * (num_warmup + args.steps)
        flops = [model_flops(config, batch) for batch in batches]
        results = [
            run_variant(args, Path(directory), variant, batches, num_warmup, flops, device)
            for variant in variants
        ]
    if not is_main_rank():
        return
    timed = batches[num_warmup:]
    flops_per_token = sum(flops[num_warmup:]) / sum(float(batch.attention_mask.sum()) for batch in timed)
    lengths = "varied lengths up to" if args.varied_lengths else "x"
    print(
        f"\n{shape}: {args.num_sequences} {lengths} {args.sequence_length} tokens ({args.prompt_tokens} prompt), "
        f"{args.dtype}, {flops_per_token / 1e9:.2f} GFLOP per token, {world_size()} rank(s)"
    )
    print(
        f"{'variant':47} {'micro':>5} {'tokens/s':>10} {'MFU':>6} {'of matmul':>9} {'peak GiB':>8} {'vs previous':>11}"
        f" {'compiling updates':>17} {'alloc retries':>13}"
    )
    previous = results[0].tokens_per_s if args.variants[0] == "previous" else None
    for result in results:
        variant = result.variant
        if result.tokens_per_s is None or result.flops_per_s is None:
            why = (
                f"all {result.compiling_updates} timed updates compiled"
                if result.compiling_updates
                else "out of memory"
            )
            print(f"{variant.name:47} {variant.micro_batch_size:>5} {why:>10}")
            continue
        achieved = result.flops_per_s / 1e12 / world_size()  # TFLOP/s per GPU
        ratio = f"{result.tokens_per_s / previous:.2f}x" if previous else "-"
        peak = f"{result.peak_gib:.1f}" if result.peak_gib is not None else "-"
        print(
            f"{variant.name:47} {variant.micro_batch_size:>5} {result.tokens_per_s:>10,.0f} "
            f"{achieved / args.peak_tflops:>6.1%} {achieved / matmul_tflops:>9.1%} {peak:>8} {ratio:>11}"
            f" {result.compiling_updates:>17} {result.alloc_retries:>13}"
        )
    for result in results:
        if result.profile is not None:
            print(f"\n{shape}, {result.variant.name}, one more update ({args.num_sequences} sequences):")
            print(format_profile(result.profile))


def world_size() -> int:
    """Ranks of the FSDP2 group: torchrun's WORLD_SIZE, else 1."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_rank() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"], choices=list(MODEL_SHAPES)
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    parser.add_argument("--num-sequences", type=int, default=16)
    parser.add_argument("--sequence-length", type=int, default=4096)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument(
        "--micro-batch", type=int, default=16, help="of the checkpointing variant (the presets')"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["previous", "chunked", "checkpointing", "compiled", "checkpointing-compiled"],
        choices=["previous", "chunked", "checkpointing", "compiled", "checkpointing-compiled"],
        help="which variants to run, in this order (ratios are to 'previous' when it comes first)",
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed updates first (module doc)")
    parser.add_argument("--steps", type=int, default=4, help="timed updates after the warm-up")
    parser.add_argument(
        "--varied-lengths",
        action="store_true",
        help="sequence lengths drawn uniformly up to --sequence-length, new ones for every update",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after each variant's timed updates, one more under torch.profiler: kernel time by kind, "
        "longest kernels, idle gaps (benchmarks/kernel_profile.py)",
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=989.0, help="datasheet dense bf16 peak (H100/H200 SXM: 989)"
    )
    args = parser.parse_args()
    if args.warmup < (2 if args.varied_lengths else 1):
        raise ValueError(
            f"--warmup must cover the compiling updates: at least 1, 2 with --varied-lengths; got {args.warmup}"
        )
    if not 0 < args.prompt_tokens < args.sequence_length:
        raise ValueError(f"--prompt-tokens must be in (0, {args.sequence_length}), got {args.prompt_tokens}")
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:  # under torchrun, each rank its own card
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    matmul = measured_matmul_tflops(device, DTYPES[args.dtype], 8192 if device.type == "cuda" else 512)
    if is_main_rank():
        print(
            f"device: {name}; peak {args.peak_tflops:.0f} TFLOP/s (datasheet); measured matmul {matmul:.0f} TFLOP/s"
        )
    for shape in args.shapes:
        benchmark_shape(args, shape, device, matmul)


if __name__ == "__main__":
    main()
