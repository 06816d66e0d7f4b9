"""Model stage (offline default policy): train the tiny policy from scratch and save it.

`python -m envs.tiny_policy.build --out DIR [--steps N] [--seed S]` writes a Hugging Face
checkpoint directory (config, safetensors weights, tokenizer, chat template, generation config)
that `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained(DIR)` load. Training is short on
purpose: the policy should master the formats but be only partly right on arithmetic, so that
RL has accuracy left to gain.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from envs.tiny_policy.chat_template import CHAT_TEMPLATE, THINK_CHAT_TEMPLATE
from envs.tiny_policy.corpus import (
    DEFAULT_ANSWER_NOISE,
    DEFAULT_MATH_FRACTION,
    DEFAULT_TERMINAL_NOISE,
    Conversation,
    make_corpus,
)
from envs.tiny_policy.examples import TokenizedExample, collate, encode_conversation, render
from envs.tiny_policy.tokenizer import IM_END, MAX_LENGTH, PAD, byte_tokenizer, train_tokenizer

NUM_TOKENIZER_TEXTS = 4000  # conversations the BPE merges are learned from
BUCKET_BATCHES = 32  # batches sorted by length together, so short examples pad to short batches


@dataclass(frozen=True)
class BuildConfig:
    """Everything that determines the built checkpoint."""

    out: Path
    steps: int = 3000
    seed: int = 0  # the shipped checkpoint was built with this seed (and --device cuda)
    batch_size: int = 32
    learning_rate: float = 2e-3
    warmup_steps: int = 50
    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    num_threads: int = 2
    math_fraction: float = DEFAULT_MATH_FRACTION
    answer_noise: float = DEFAULT_ANSWER_NOISE
    terminal_noise: float = DEFAULT_TERMINAL_NOISE
    think: bool = False  # the thinking variant: <think> reasoning and a template that drops it later
    device: str = "cpu"
    log_every: int = 50

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "num_threads", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must divide by num_heads ({self.num_heads}) and "
                f"num_heads by num_kv_heads ({self.num_kv_heads})"
            )


def build_tokenizer(config: BuildConfig, corpus: list[Conversation]) -> PreTrainedTokenizerFast:
    """Learn BPE merges from rendered conversations (rendering needs no merges, only the template)."""
    chat_template = THINK_CHAT_TEMPLATE if config.think else CHAT_TEMPLATE
    renderer = byte_tokenizer(chat_template)
    texts = [render(renderer, c, len(c.messages), prompt=False) for c in corpus[:NUM_TOKENIZER_TEXTS]]
    return train_tokenizer(texts, vocab_size=config.vocab_size, chat_template=chat_template)


def build_model(config: BuildConfig, tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2 causal LM sized by `config`, with tied embeddings."""
    model_config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=MAX_LENGTH,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
    )
    return Qwen2ForCausalLM(model_config)


def length_grouped_batches(
    examples: list[TokenizedExample], batch_size: int, rng: random.Random
) -> list[list[TokenizedExample]]:
    """Batches of similar length, in random order: less padding, same examples."""
    batches = []
    bucket_size = batch_size * BUCKET_BATCHES
    for start in range(0, len(examples), bucket_size):
        bucket = sorted(examples[start : start + bucket_size], key=lambda e: len(e.input_ids))
        batches.extend(bucket[i : i + batch_size] for i in range(0, len(bucket), batch_size))
    rng.shuffle(batches)
    return batches


def learning_rate_at(step: int, config: BuildConfig) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    model: Qwen2ForCausalLM, batches: list[list[TokenizedExample]], config: BuildConfig, pad_id: int
) -> None:
    """Plain AdamW next-token training on the assistant tokens of each batch."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, betas=(0.9, 0.95), weight_decay=0.01
    )
    device = torch.device(config.device)
    model.to(device).train()
    start = time.perf_counter()
    for step, batch in enumerate(batches[: config.steps]):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(step, config)
        inputs = {name: tensor.to(device) for name, tensor in collate(batch, pad_id).items()}
        loss = model(**inputs).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            elapsed = time.perf_counter() - start
            print(
                f"step {step + 1}/{config.steps} loss {loss.item():.4f} elapsed_s {elapsed:.0f}", flush=True
            )
    model.to("cpu").eval()


def save(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    """Write the checkpoint directory: weights, config, tokenizer, template, generation config."""
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=model.config.eos_token_id,
        pad_token_id=model.config.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_k=0,  # sample from the full distribution, the one RL's logprobs describe
        top_p=1.0,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def build(config: BuildConfig) -> None:
    """Corpus, tokenizer, model, training, checkpoint: the whole build, deterministic in `seed`."""
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.num_threads)
    corpus = make_corpus(
        config.steps * config.batch_size,
        config.seed,
        config.math_fraction,
        answer_noise=config.answer_noise,
        think=config.think,
        terminal_noise=config.terminal_noise,
    )
    tokenizer = build_tokenizer(config, corpus)
    examples = [encode_conversation(tokenizer, conversation) for conversation in corpus]
    model = build_model(config, tokenizer)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"vocab {len(tokenizer)} params {num_params} examples {len(examples)}", flush=True)
    batches = length_grouped_batches(examples, config.batch_size, random.Random(config.seed))
    train(model, batches, config, pad_id=tokenizer.pad_token_id)
    save(model, tokenizer, config.out)


def parse_args(argv: list[str] | None = None) -> BuildConfig:
    parser = argparse.ArgumentParser(description="Train the offline tiny policy and save a HF checkpoint.")
    parser.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    parser.add_argument("--steps", type=int, default=BuildConfig.steps, help="optimizer steps")
    parser.add_argument("--seed", type=int, default=BuildConfig.seed)
    parser.add_argument("--batch-size", type=int, default=BuildConfig.batch_size)
    parser.add_argument("--learning-rate", type=float, default=BuildConfig.learning_rate)
    parser.add_argument("--hidden-size", type=int, default=BuildConfig.hidden_size)
    parser.add_argument("--intermediate-size", type=int, default=BuildConfig.intermediate_size)
    parser.add_argument("--num-layers", type=int, default=BuildConfig.num_layers)
    parser.add_argument("--num-heads", type=int, default=BuildConfig.num_heads)
    parser.add_argument("--num-kv-heads", type=int, default=BuildConfig.num_kv_heads)
    parser.add_argument("--math-fraction", type=float, default=BuildConfig.math_fraction)
    parser.add_argument(
        "--answer-noise",
        type=float,
        default=BuildConfig.answer_noise,
        help="share of math replies with a mistake",
    )
    parser.add_argument(
        "--terminal-noise",
        type=float,
        default=BuildConfig.terminal_noise,
        help="share of terminal episodes with a mistake",
    )
    parser.add_argument(
        "--think", action="store_true", help="the thinking variant (<think> reasoning; model=tiny_think)"
    )
    parser.add_argument("--device", default=BuildConfig.device, help="torch device to train on, e.g. cuda")
    parser.add_argument("--threads", type=int, default=BuildConfig.num_threads, help="torch CPU threads")
    args = parser.parse_args(argv)
    return BuildConfig(
        out=args.out,
        steps=args.steps,
        seed=args.seed,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        num_threads=args.threads,
        math_fraction=args.math_fraction,
        answer_noise=args.answer_noise,
        terminal_noise=args.terminal_noise,
        think=args.think,
        device=args.device,
        warmup_steps=min(BuildConfig.warmup_steps, max(1, args.steps // 10)),
    )


if __name__ == "__main__":
    build(parse_args())
