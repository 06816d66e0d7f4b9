"""Test inputs: a tiny random Qwen2 causal LM with a word-level tokenizer, hand-built trajectories, a batch of them."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from agentrl.rollout.trajectory import Status, Trajectory, Turn
from agentrl.trainer.actor_config import ActorConfig
from agentrl.trainer.batch import TrainBatch, build_train_batch

VOCAB_SIZE = 32
PAD_TOKEN_ID = 0


def write_tiny_model(directory: Path, seed: int = 0, tie_word_embeddings: bool = False) -> Path:
    """Save a 2-layer, 16-wide Qwen2 with random weights and its tokenizer into `directory`."""
    vocab = {"<pad>": PAD_TOKEN_ID, "<eos>": 1, **{f"w{i}": i for i in range(2, VOCAB_SIZE)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=PAD_TOKEN_ID,
        eos_token_id=1,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    # Larger-than-default weights make the random policy far from uniform, so ratios and clips move.
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(5.0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def two_turn_trajectory(group_id: int = 0, reward: float = 1.0) -> Trajectory:
    """prompt [2 3] | sampled [4 5] | observation [6 7 8] | sampled [9 1]."""
    return Trajectory(
        group_id=group_id,
        prompt_ids=[2, 3],
        response_ids=[4, 5, 6, 7, 8, 9, 1],
        loss_mask=[1, 1, 0, 0, 0, 1, 1],
        rollout_logprobs=[-0.1, -0.2, 0.0, 0.0, 0.0, -0.3, -0.4],
        turns=[
            Turn("w4 w5", [4, 5], [{"role": "user", "content": "w7"}], [6, 7, 8], 0.0, "stop"),
            Turn("w9 <eos>", [9, 1], [], [], reward, "stop"),
        ],
        reward=reward,
    )


def short_trajectory(group_id: int, response_ids: list[int], status: Status = Status.COMPLETED) -> Trajectory:
    """A one-turn trajectory whose every response token was sampled."""
    return Trajectory(
        group_id=group_id,
        prompt_ids=[2],
        response_ids=response_ids,
        loss_mask=[1] * len(response_ids),
        rollout_logprobs=[-0.5] * len(response_ids),
        status=status,
    )


def multi_turn_batch() -> TrainBatch:
    """Three rows in two groups: the two-turn trajectory and two short ones."""
    trajectories = [two_turn_trajectory(0), short_trajectory(0, [4, 9]), short_trajectory(1, [5, 6, 7])]
    return build_train_batch(trajectories, torch.tensor([1.0, -1.0, 0.5]), PAD_TOKEN_ID)


def actor_config(**overrides) -> ActorConfig:
    """One mini-batch of both groups of `multi_turn_batch`, one micro-batch, a learning rate that shows."""
    settings = {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 4, "optim": {"lr": 1e-2}}
    return ActorConfig(**{**settings, **overrides})
