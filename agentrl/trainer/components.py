"""Set-up stage: turn a validated Config into the live parts the training loop drives."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from agentrl.config import Config
from agentrl.data import generated_rows, load_rows
from agentrl.engine.protocol import InferenceEngine
from agentrl.engine.transformers_engine import TransformersEngine
from agentrl.env.base import TextEnv
from agentrl.env.registry import make
from agentrl.rollout.agent_loop import Budgets, Sampling
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from agentrl.trainer.data_order import StepSampler
from agentrl.trainer.policy_worker import PolicyWorker

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Components:
    """Everything one training run holds on to."""

    run_dir: Path
    make_env: Any  # () -> TextEnv
    engine: InferenceEngine
    template: ChatTemplate
    pad_token_id: int
    actor: PolicyWorker
    reference: PolicyWorker | None
    sampler: StepSampler
    extra_sampler: StepSampler  # extra batches for dynamic sampling
    val_rows: list[dict[str, Any]]
    budgets: Budgets
    train_sampling: Sampling


def resolve_model_path(path: str) -> str:
    return str(DEFAULT_MODEL_PATH) if path == "tiny" else path


def resolve_device(device: str) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def _rows(files: list[str], config: Config, num_rows: int, split: str) -> list[dict[str, Any]]:
    if files:
        return [row for path in files for row in load_rows(path)]
    data = config.data
    return generated_rows(
        data.generator, num_rows, seed=config.trainer.seed, split=split, **data.generator_kwargs
    )


def _check_env(make_env) -> None:
    """Build one env before any model loads, so a bad env id or kwargs fails fast."""
    env: TextEnv = make_env()
    env.close()


def build_components(config: Config, run_dir: Path) -> Components:
    """Load data, env factory, tokenizer, engine, actor and (when KL is on) the reference policy."""
    if config.trainer.num_threads:
        torch.set_num_threads(config.trainer.num_threads)
    make_env = functools.partial(make, config.env.id, **config.env.kwargs)
    _check_env(make_env)
    train_rows = _rows(config.data.train_files, config, config.data.train_size, "train")
    val_rows = _rows(config.data.val_files, config, config.data.val_size, "val")
    data, rollout = config.data, config.rollout
    model_path = resolve_model_path(config.model.path)
    device, dtype = resolve_device(config.trainer.device), DTYPES[config.model.dtype]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    engine = TransformersEngine.from_pretrained(
        model_path,
        device=resolve_device(config.engine.device),
        dtype=dtype,
        max_batch_size=config.engine.max_batch_size,
        seed=config.trainer.seed,
    )
    worker_kwargs = {
        "actor": config.actor,
        "device": device,
        "dtype": dtype,
        "temperature": rollout.temperature,
    }
    actor = PolicyWorker(model_path, trainable=True, **worker_kwargs)
    reference = (
        PolicyWorker(model_path, trainable=False, **worker_kwargs) if config.actor.use_kl_loss else None
    )
    return Components(
        run_dir=run_dir,
        make_env=make_env,
        engine=engine,
        template=ChatTemplate(tokenizer),
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        actor=actor,
        reference=reference,
        sampler=StepSampler(train_rows, data.train_batch_size, config.trainer.seed, data.shuffle),
        extra_sampler=StepSampler(train_rows, data.train_batch_size, config.trainer.seed + 1, data.shuffle),
        val_rows=val_rows,
        budgets=Budgets(
            max_turns=rollout.max_turns,
            max_new_tokens_per_turn=rollout.max_new_tokens_per_turn,
            max_tokens_per_episode=rollout.max_tokens_per_episode,
            step_timeout_s=rollout.step_timeout_s,
            episode_timeout_s=rollout.episode_timeout_s,
        ),
        train_sampling=Sampling(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k),
    )
