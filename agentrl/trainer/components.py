"""Set-up stage: turn a validated Config into the live parts the training loop drives."""

from __future__ import annotations

import functools
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers

from agentrl.config import Config
from agentrl.data import generated_rows, load_rows
from agentrl.devices import resolve_device
from agentrl.engine.factory import build_engine
from agentrl.engine.protocol import InferenceEngine
from agentrl.env.registry import make
from agentrl.model_path import load_tokenizer, resolve_model_path
from agentrl.rewards.apply import RewardFunctions
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.trainer.data_order import StepSampler
from agentrl.trainer.loop import Trainer, TrainerParts
from agentrl.trainer.policy_worker import PolicyWorker

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class TaskData:
    """The training rows and the held-out rows of a run."""

    train_rows: list[dict[str, Any]]
    val_rows: list[dict[str, Any]]
    note: str | None = None  # how the held-out rows were chosen, when the user should know


def load_task_data(config: Config) -> TaskData:
    """Rows from the files or the generator. Evaluation never silently uses unrelated rows.

    With train_files and no val_files, `data.val_size` rows are held out of the training files
    by a seeded shuffle, and the run says so.
    """
    data, seed = config.data, config.trainer.seed
    if not data.train_files:
        generate = functools.partial(generated_rows, data.generator, seed=seed, **data.generator_kwargs)
        train_rows = generate(data.train_size, split="train")
        if data.val_files:
            return TaskData(train_rows, [row for path in data.val_files for row in load_rows(path)])
        return TaskData(train_rows, generate(data.val_size, split="val"))
    rows = [row for path in data.train_files for row in load_rows(path)]
    if data.val_files:
        return TaskData(rows, [row for path in data.val_files for row in load_rows(path)])
    if len(rows) <= data.val_size:
        raise ValueError(
            f"data.train_files hold {len(rows)} rows, too few to hold out data.val_size={data.val_size} "
            "for evaluation; set data.val_files=[...] or a smaller data.val_size"
        )
    order = list(range(len(rows)))
    random.Random(f"val-split-{seed}").shuffle(order)
    held_out = set(order[: data.val_size])
    note = (
        f"no data.val_files: evaluating on {data.val_size} rows held out of data.train_files "
        f"(seeded by trainer.seed={seed}); the other {len(rows) - data.val_size} rows train"
    )
    return TaskData(
        [row for i, row in enumerate(rows) if i not in held_out],
        [rows[i] for i in sorted(held_out)],
        note,
    )


def build_env_factory(config: Config) -> functools.partial:
    """`make(env.id, **env.kwargs)` as a factory; builds one env now, so a bad id or kwargs fails fast."""
    make_env = functools.partial(make, config.env.id, **config.env.kwargs)
    try:
        make_env().close()
    except TypeError as error:  # the env's constructor rejected env.kwargs
        raise ValueError(
            f"env {config.env.id!r} cannot be built with env.kwargs={config.env.kwargs}: {error}"
        ) from None
    return make_env


def build_trainer(config: Config, run_dir: Path, engine: InferenceEngine | None = None) -> Trainer:
    """Load data, env factory, tokenizer, engine, actor and (when KL is on) the reference policy.

    `engine` replaces the one the engine section would build (a launcher's client of its servers).
    """
    if config.trainer.num_threads:
        torch.set_num_threads(config.trainer.num_threads)
    if not sys.stderr.isatty():  # progress bars belong on a terminal, not in a log file
        transformers.utils.logging.disable_progress_bar()
    make_env = build_env_factory(config)
    # A bad reference fails before any work.
    reward_functions = RewardFunctions.from_config(
        config.reward, config.trainer.total_training_steps, config.rollout.reward_bound
    )
    data = load_task_data(config)
    if data.note:
        print(data.note, flush=True)
    model_path = resolve_model_path(config.model.path)
    dtype = DTYPES[config.model.dtype]
    tokenizer = load_tokenizer(model_path)
    engine = engine or build_engine(config.model, config.engine, seed=config.trainer.seed)
    worker_kwargs = {
        "actor": config.actor,
        "device": resolve_device(config.trainer.device, "trainer.device"),
        "dtype": dtype,
        "temperature": config.rollout.temperature,
    }
    actor = PolicyWorker(model_path, trainable=True, **worker_kwargs)
    reference = (
        PolicyWorker(model_path, trainable=False, **worker_kwargs) if config.actor.use_kl_loss else None
    )
    batch_size, seed, shuffle = config.data.train_batch_size, config.trainer.seed, config.data.shuffle
    parts = TrainerParts(
        run_dir=run_dir,
        make_env=make_env,
        engine=engine,
        template=ChatTemplate(tokenizer),
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        actor=actor,
        reference=reference,
        sampler=StepSampler(data.train_rows, batch_size, seed, shuffle),
        extra_sampler=StepSampler(data.train_rows, batch_size, seed + 1, shuffle),
        val_rows=data.val_rows,
        reward_functions=reward_functions,
    )
    return Trainer(config, parts)
