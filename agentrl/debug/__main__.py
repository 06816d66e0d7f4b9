"""`python -m agentrl.debug env=NAME [key=value ...] [--row N] [--policy model|human] [--script FILE]`
or `python -m agentrl.debug --replay RUN_DIR/rollouts/step_N.jsonl --index I`.

Interactive on a terminal (commands: `help`; `agentrl.debug.terminal`); with `--script FILE` or
piped standard input it runs the commands and prints a transcript, exiting 1 if any command failed.
Ctrl-C leaves with status 130, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path

import yaml
from rich.console import Console

from agentrl.check_template.__main__ import stop_token_ids
from agentrl.check_template.checks import template_facts
from agentrl.config import Config
from agentrl.config_loader import ConfigError, load_config
from agentrl.data_mixture import ENV_COLUMN
from agentrl.debug.commands import Quit, run_command, show_all
from agentrl.debug.replay_command import replay
from agentrl.debug.session import DebugSession, EpisodeSetup
from agentrl.debug.terminal import INTERRUPTED, interact
from agentrl.engine.factory import build_engine
from agentrl.model_path import load_tokenizer, resolve_model_path
from agentrl.renderers import build_renderer
from agentrl.trainer.components import build_routes, load_task_data


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m agentrl.debug", description=__doc__)
    parser.add_argument(
        "--row", type=int, help="index of the training row to open (default: a seeded random row)"
    )
    parser.add_argument(
        "--seed", type=int, help="picks the random row and seeds sampling (default: trainer.seed)"
    )
    parser.add_argument("--policy", choices=("model", "human"), default="model")
    parser.add_argument("--script", type=Path, help="a file of commands, one a line ('#' starts a comment)")
    parser.add_argument("--replay", type=Path, help="a rollouts/step_N.jsonl (or val_step_N.jsonl) dump")
    parser.add_argument("--index", type=int, default=0, help="which line of the --replay file")
    args, overrides = parser.parse_known_args(argv)
    flags = [word for word in overrides if word.startswith("-")]
    if flags:
        parser.error(f"unknown option {flags[0]}")
    return args, overrides


def replay_config(dump: Path, overrides: list[str]) -> Config:
    """The recorded run's config.yaml next to rollouts/, else the presets and overrides."""
    run_config = dump.resolve().parent.parent / "config.yaml"
    if not run_config.exists():
        return load_config(overrides)
    if overrides:
        raise ConfigError(f"--replay uses the run's own {run_config}; drop the overrides {overrides}")
    return Config.model_validate(yaml.safe_load(run_config.read_text()))


def build_setup(config: Config, row: int | None, seed: int) -> EpisodeSetup:
    rows = load_task_data(config).train_rows
    index = random.Random(seed).randrange(len(rows)) if row is None else row
    if not 0 <= index < len(rows):
        raise ValueError(f"--row {index} is out of range: the training data has {len(rows)} rows")
    model_path = resolve_model_path(config.model.path)
    tokenizer = load_tokenizer(model_path)
    template = build_renderer(tokenizer, config.model.renderer)  # parses as training does
    # A mixed config drives the env of the chosen row, with that env's budgets.
    env_name = rows[index][ENV_COLUMN] if config.env.mixture else config.env.id
    route = build_routes(config, template.parser)[env_name]
    engine = build_engine(config.model, config.engine, seed=seed)
    facts, _ = template_facts(template, stop_token_ids(model_path, tokenizer))
    return EpisodeSetup(
        make_env=route.make_env, engine=engine, template=template, row=rows[index], row_index=index,
        seed=seed + index, sampling_seed=seed, budgets=route.budgets, sampling=config.rollout.sampling(),
        stop_token_id=facts.stop_token_id, env_name=env_name,
    )  # fmt: skip


async def run_script(session: DebugSession, console: Console, lines: list[str]) -> int:
    """Run each line as a command, echoing it; 1 if any failed."""
    failures = 0
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            console.print(f"debug> {line}", style="bold")
        try:
            await run_command(session, console, line, read_action=None)
        except ValueError as error:
            failures += 1
            console.print(f"error: {error}", style="red")
        except Quit:
            break
    return 1 if failures else 0


async def debug(args: argparse.Namespace, config: Config, console: Console) -> int:
    seed = config.trainer.seed if args.seed is None else args.seed
    # Off the loop: building checks the env with its sync API, which runs a loop of its own.
    setup = await asyncio.to_thread(build_setup, config, args.row, seed)
    session = DebugSession(setup, args.policy)
    console.print(f"env {setup.env_name}, row {setup.row_index}, policy {args.policy}, seed {seed}")
    try:
        await session.start()
        show_all(session, console)
        if args.script is not None:
            return await run_script(session, console, args.script.read_text().splitlines())
        if not sys.stdin.isatty():
            return await run_script(session, console, sys.stdin.read().splitlines())
        return await interact(session, console)
    finally:
        await session.close()
        await setup.engine.close()


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    console = Console(highlight=False, soft_wrap=True)
    try:
        if args.replay is not None:
            return replay(args.replay, args.index, replay_config(args.replay, overrides), console)
        return asyncio.run(debug(args, load_config(overrides), console))
    except ValueError as error:  # ConfigError included: a bad key, row or replay index
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while loading or running a script
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
