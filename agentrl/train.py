"""Entry point: `python -m agentrl.train [group=preset ...] [key.sub=value ...] [--print-config]`."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import yaml

from agentrl.config import Config
from agentrl.config_loader import (
    ConfigError,
    config_changes,
    config_groups,
    describe_config,
    dump_config,
    load_config,
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    presets = "; ".join(f"{group}={'|'.join(names)}" for group, names in sorted(config_groups().items()))
    parser = argparse.ArgumentParser(
        prog="python -m agentrl.train",
        description="Train a policy with GRPO-family RL. Example: python -m agentrl.train env=math rollout.n=8",
        epilog=f"Presets: {presets}. --describe lists every key with its value and meaning.",
    )
    parser.add_argument(
        "overrides", nargs="*", help="config group presets (env=math) and key=value overrides"
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the fully resolved config and exit"
    )
    parser.add_argument(
        "--describe", nargs="?", const="", metavar="KEY",
        help="print each setting whose key starts with KEY (e.g. actor.clip) with its value and meaning, and exit",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.describe and "=" in args.describe:  # `--describe env=code_sandbox`: an override, not a KEY
        args.overrides.append(args.describe)
        args.describe = ""
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = load_config(args.overrides)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_config(config), end="")
        return 0
    if args.describe is not None:
        return describe(config, args.describe)
    for warning in config.warnings():
        print(f"warning: {warning}", file=sys.stderr)
    # Heavy imports only after the config is known to be valid.
    from agentrl.engine.sglang_protocol import EngineRequestError
    from agentrl.trainer.components import build_env_factory, build_trainer
    from agentrl.trainer.health import RunStopped

    try:
        build_env_factory(config)  # a bad env id or env.kwargs reads like a config error
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    run_dir = Path(config.trainer.run_dir or f"runs/{config.trainer.experiment_name}")
    run_dir.mkdir(parents=True, exist_ok=True)
    is_main = os.environ.get("RANK", "0") == "0"  # under torchrun, one rank writes the run's records
    if is_main:
        record_config(run_dir, config)
    if config.trainer.launcher == "ray":  # each Ray policy worker runs the build_trainer(...).fit() below
        from agentrl.launchers.ray_launcher import run_with_ray

        status = run_with_ray(config, run_dir)
        return status or report(run_dir)
    try:
        trainer = build_trainer(config, run_dir)
    except (ValueError, EngineRequestError) as error:  # bad data files, an engine that does not answer
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        asyncio.run(trainer.fit())
    except RunStopped as stopped:
        print(f"error: {stopped}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if is_main:
            print(interrupted(run_dir, config.trainer.resume == "auto"), file=sys.stderr)
        return 130  # the shell's status for a run ended by SIGINT
    return report(run_dir) if is_main else 0


def describe(config: Config, key: str) -> int:
    """Print the settings whose key starts with `key` (every one when empty), with values and meanings."""
    lines = [line for line in describe_config(config) if line.startswith(key)]
    if not lines:
        print(
            f"error: no setting's key starts with {key!r}; --describe alone lists them all", file=sys.stderr
        )
        return 2
    print("\n".join(lines))
    return 0


def record_config(run_dir: Path, config: Config) -> None:
    """Write the run's config.yaml; a run resumed with changed settings names them and keeps the old file."""
    from agentrl.trainer.checkpoint import checkpoint_steps

    path, text = run_dir / "config.yaml", dump_config(config)
    steps = checkpoint_steps(run_dir) if config.trainer.resume == "auto" else []
    earlier = path.read_text() if steps and path.is_file() else text
    if earlier != text:
        changes = config_changes(yaml.safe_load(earlier), config.model_dump(mode="json"))
        kept = path.rename(run_dir / f"config.before_step_{steps[-1] + 1}.yaml")
        print(
            f"warning: resuming {run_dir} after step {steps[-1]} with changed settings ({'; '.join(changes)}); "
            f"the earlier config.yaml is kept as {kept.name}",
            file=sys.stderr,
        )
    path.write_text(text)


def interrupted(run_dir: Path, resumes: bool) -> str:
    """What an interrupted run left behind, and how to go on from it."""
    from agentrl.trainer.checkpoint import checkpoint_steps

    steps = checkpoint_steps(run_dir)
    if not steps:
        return f"interrupted before the first checkpoint: {run_dir} holds none to resume from"
    where = f"the checkpoint of step {steps[-1]} in {run_dir / 'checkpoints'}"
    if not resumes:
        return f"interrupted; {where} is kept (trainer.resume=auto resumes from it)"
    return f"interrupted; the same command resumes from {where}"


def report(run_dir: Path) -> int:
    """Print where the run's policy is and how it evaluated; the exit status of a finished run."""
    print(f"run dir: {run_dir}  final policy: {run_dir / 'hf_model'}")
    print(held_out_summary(run_dir / "metrics.jsonl"))
    return 0


def held_out_summary(metrics_path: Path) -> str:
    """First and last held-out evaluation of the run, read back from metrics.jsonl."""
    if not metrics_path.is_file():
        return "no held-out evaluation was run"
    evaluations = [
        record
        for line in metrics_path.read_text().splitlines()
        if "val/reward/mean" in (record := json.loads(line))
    ]
    if not evaluations:
        return "no held-out evaluation was run"
    first, last = evaluations[0], evaluations[-1]
    key = "val/accuracy" if "val/accuracy" in last else "val/reward/mean"

    def value(record: dict) -> str:
        error = record.get(f"{key}_stderr")
        return f"{record[key]:.3f}" + (f" ± {error:.3f}" if error is not None else "")

    num_problems = int(last["val/num_problems"])
    if first is last:
        return f"held-out {key.removeprefix('val/')}: {value(last)} at step {last['step']} ({num_problems} problems)"
    return (
        f"held-out {key.removeprefix('val/')}: {value(first)} at step {first['step']} -> "
        f"{value(last)} at step {last['step']} ({num_problems} problems; ± one standard error)"
    )


if __name__ == "__main__":
    exit_status = main()
    if "torch.distributed" in sys.modules:  # a training run; under torchrun, one rank of several
        from agentrl.trainer.distributed import exit_rank

        exit_rank(exit_status)
    sys.exit(exit_status)
