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
from agentrl.data import DataSource, generated_rows, load_rows
from agentrl.data_mixture import MixtureSampler, tag_rows
from agentrl.devices import resolve_device
from agentrl.engine.factory import build_engine
from agentrl.engine.protocol import InferenceEngine
from agentrl.env.base import TextEnv
from agentrl.env.registry import make
from agentrl.model_path import load_tokenizer, resolve_model_path
from agentrl.parsing.tool_calls import ToolCallParser
from agentrl.renderers import build_renderer, use_run_parser
from agentrl.rewards.apply import RewardFunctions
from agentrl.trainer.data_order import StepSampler
from agentrl.trainer.env_mixture import EnvRoute, build_env_routes
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
    by a seeded shuffle, and the run says so. A mixed run (`env.mixture`) loads each env's rows
    from its own sources and tags them with the env's name.
    """
    if not config.env.mixture:
        return load_source_rows(config.data, config.trainer.seed)
    train_rows, val_rows, notes = [], [], []
    for name, entry in config.env.mixture.items():
        data = load_source_rows(entry.data, config.trainer.seed, f"env.mixture.{name}.data")
        train_rows += tag_rows(data.train_rows, name, f"env.mixture.{name} training")
        val_rows += tag_rows(data.val_rows, name, f"env.mixture.{name} held-out")
        notes += [data.note] if data.note else []
    return TaskData(train_rows, val_rows, "; ".join(notes) or None)


def load_source_rows(data: DataSource, seed: int, prefix: str = "data") -> TaskData:
    """`load_task_data` of one source of rows (`prefix` names its settings in messages)."""
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
            f"{prefix}.train_files hold {len(rows)} rows, too few to hold out {prefix}.val_size={data.val_size} "
            f"for evaluation; set {prefix}.val_files=[...] or a smaller {prefix}.val_size"
        )
    order = list(range(len(rows)))
    random.Random(f"val-split-{seed}").shuffle(order)
    held_out = set(order[: data.val_size])
    note = (
        f"no {prefix}.val_files: evaluating on {data.val_size} rows held out of {prefix}.train_files "
        f"(seeded by trainer.seed={seed}); the other {len(rows) - data.val_size} rows train"
    )
    return TaskData(
        [row for i, row in enumerate(rows) if i not in held_out],
        [rows[i] for i in sorted(held_out)],
        note,
    )


def build_env_factory(config: Config, reply_parser: ToolCallParser | None = None) -> functools.partial:
    """`make(env.id, **env.kwargs)` as a factory; builds one env now, so a bad id or kwargs fails fast.

    Each env it builds parses replies with `reply_parser` (the run's renderer's), when given.
    A mixed run gets a factory that says one env must be chosen (for tools that drive one env;
    training, eval and the debugger route rows with `build_routes`).
    """
    if config.env.mixture:
        return functools.partial(_one_env_needed, sorted(config.env.mixture))
    make_env = functools.partial(_make_with_parser, config.env.id, reply_parser, **config.env.kwargs)
    try:
        make_env().close()
    except TypeError as error:  # the env's constructor rejected env.kwargs
        raise ValueError(
            f"env {config.env.id!r} cannot be built with env.kwargs={config.env.kwargs}: {error}"
        ) from None
    return make_env


def build_routes(config: Config, reply_parser: ToolCallParser | None = None) -> dict[str, EnvRoute]:
    """Each env of the config by name, with its factory and budgets: the mixture's envs, or the one
    env named by its id. Builds each env once, so a bad id or kwargs fails fast."""
    if config.env.mixture:
        return build_env_routes(
            config.env.mixture, config.rollout, functools.partial(env_factory, reply_parser)
        )
    return {config.env.id: EnvRoute(build_env_factory(config, reply_parser), config.rollout.budgets())}


def _one_env_needed(names: list[str]) -> TextEnv:
    raise ValueError(
        f"this config mixes the envs {', '.join(names)} (env.mixture); this command drives one env: choose "
        "one with env=<preset> (e.g. env=math)"
    )


def env_factory(
    reply_parser: ToolCallParser | None, env_id: str, kwargs: dict[str, Any]
) -> functools.partial:
    """A factory of env `env_id` built with `kwargs`, parsing replies with `reply_parser` when given."""
    return functools.partial(_make_with_parser, env_id, reply_parser, **kwargs)


def _make_with_parser(env_id: str, reply_parser: ToolCallParser | None, **kwargs: Any) -> TextEnv:
    env = make(env_id, **kwargs)
    if reply_parser is not None:
        env.use_reply_parser(reply_parser)
    return env


def build_trainer(config: Config, run_dir: Path, engine: InferenceEngine | None = None) -> Trainer:
    """Load data, env factory, tokenizer, engine, actor and (when KL is on) the reference policy.

    `engine` replaces the one the engine section would build (a launcher's client of its servers).
    """
    if config.trainer.num_threads:
        torch.set_num_threads(config.trainer.num_threads)
    if not sys.stderr.isatty():  # progress bars belong on a terminal, not in a log file
        transformers.utils.logging.disable_progress_bar()
    model_path = resolve_model_path(config.model.path)
    tokenizer = load_tokenizer(model_path)
    renderer = build_renderer(tokenizer, config.model.renderer)  # the one renderer of the run
    use_run_parser(renderer.parser)  # what reward functions in this process parse replies with
    # Each env is built once here, so a bad id or kwargs fails before any work; so does a bad reference.
    routes = build_routes(config, renderer.parser)
    make_env = build_env_factory(config) if config.env.mixture else routes[config.env.id].make_env
    reward_functions = RewardFunctions.from_config(
        config.reward, config.trainer.total_training_steps, config.rollout.reward_bound,
        max_resp_len=config.rollout.max_turns * config.rollout.max_new_tokens_per_turn,
    )  # fmt: skip
    data = load_task_data(config)
    if data.note:
        print(data.note, flush=True)
    dtype = DTYPES[config.model.dtype]
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
    env_routes, sampler, extra_sampler = {}, None, None
    if config.env.mixture:
        env_routes = routes
        weights = {name: entry.weight for name, entry in config.env.mixture.items()}
        sampler = MixtureSampler(data.train_rows, weights, batch_size, seed, shuffle)
        extra_sampler = MixtureSampler(data.train_rows, weights, batch_size, seed + 1, shuffle)
    parts = TrainerParts(
        run_dir=run_dir,
        make_env=make_env,
        engine=engine,
        template=renderer,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        actor=actor,
        reference=reference,
        sampler=sampler or StepSampler(data.train_rows, batch_size, seed, shuffle),
        extra_sampler=extra_sampler or StepSampler(data.train_rows, batch_size, seed + 1, shuffle),
        val_rows=data.val_rows,
        reward_functions=reward_functions,
        env_routes=env_routes,
    )
    return Trainer(config, parts)
