"""Entry point: `python -m agentrl.train [group=preset ...] [key.sub=value ...] [--print-config]`."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
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
from agentrl.run_files import replacing


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
    run_dir = Path(config.trainer.run_dir or f"runs/{config.trainer.experiment_name}")
    try:
        prepare_run_dir(run_dir)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # Heavy imports only after the config is known to be valid.
    from agentrl.engine.remote.sglang_protocol import EngineRequestError
    from agentrl.trainer.components import build_env_factory, build_trainer
    from agentrl.trainer.health import RunStopped

    try:
        build_env_factory(config)  # a bad env id or env.kwargs reads like a config error
        check_run_dir_use(run_dir, config)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    is_main = os.environ.get("RANK", "0") == "0"  # under torchrun, one rank writes the run's records
    # config.yaml is written only once the parts have been built: a failed command leaves no record.
    if config.trainer.launcher == "ray":  # each Ray policy worker runs the build_trainer(...).fit() below
        from agentrl.launchers.ray_launcher import run_with_ray

        status = check_parts(config) or record(run_dir, config)
        return status or run_with_ray(config, run_dir) or report(run_dir)
    try:
        trainer = build_trainer(config, run_dir)
    except (ValueError, EngineRequestError) as error:  # bad data files, an engine that does not answer
        print(f"error: {error}", file=sys.stderr)
        return 2
    if is_main and (status := record(run_dir, config)):
        return status
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


def prepare_run_dir(run_dir: Path) -> None:
    """Create the run dir and check that files can be written in it; ValueError says what is wrong."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as error:
        what = (
            "is not a directory"
            if isinstance(error, FileExistsError)
            else f"cannot be used ({error.strerror})"
        )
        raise ValueError(
            f"run dir {run_dir} {what}; set trainer.run_dir to a directory this process can create and write"
        ) from None


def check_run_dir_use(run_dir: Path, config: Config) -> None:
    """ValueError when this command would overwrite the records of a run already in `run_dir`.

    Only a run that continues from the run dir's checkpoints may use it. An evaluation-only run
    (no training steps) or one with trainer.resume=disable would start its records over; a
    resumable run with no checkpoint yet starts over too, and says so.
    """
    from agentrl.metrics import read_metrics
    from agentrl.trainer.checkpoint import checkpoint_steps

    metrics_path = run_dir / "metrics.jsonl"
    records = read_metrics(metrics_path)[0] if metrics_path.is_file() else []
    steps = checkpoint_steps(run_dir)
    if not records and not steps:
        return
    held = f"run dir {run_dir} holds a run (metrics up to step {max((r['step'] for r in records), default=0)}"
    held += f", checkpoint of step {steps[-1]})" if steps else ", no checkpoint)"
    fresh = "; use a new trainer.experiment_name (or trainer.run_dir) to keep it"
    if config.trainer.total_training_steps == 0:
        raise ValueError(
            f"{held}; an evaluation-only run (trainer.total_training_steps=0) would overwrite it{fresh}"
        )
    if config.trainer.resume == "disable":
        raise ValueError(
            f"{held}; trainer.resume=disable would start it over{fresh}, or trainer.resume=auto to continue it"
        )
    if not steps:
        print(
            f"warning: {held}; with no checkpoint to continue from, this run starts it over", file=sys.stderr
        )


def check_parts(config: Config) -> int:
    """Import the reward functions and resolve the model path; exit status 2 (and why) if one fails."""
    from agentrl.model_path import resolve_model_path
    from agentrl.rewards.loading import load_functions

    try:
        load_functions(config.reward)
        resolve_model_path(config.model.path)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def record(run_dir: Path, config: Config) -> int:
    """`record_config`, with what stops it as one line: status 2 for a broken record, 1 for a disk error."""
    try:
        record_config(run_dir, config)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: cannot write {run_dir / 'config.yaml'}: {error.strerror}", file=sys.stderr)
        return 1
    return 0


def record_config(run_dir: Path, config: Config) -> None:
    """Write the run's config.yaml; a run resumed with changed settings names them and keeps the old file.

    config.yaml is replaced whole: a write that fails (a full disk) leaves the earlier file. A
    kept file is never overwritten; a second change before the same step is kept as
    config.before_step_N.2.yaml, and so on.
    """
    from agentrl.trainer.checkpoint import checkpoint_steps

    path, text = run_dir / "config.yaml", dump_config(config)
    steps = checkpoint_steps(run_dir) if config.trainer.resume == "auto" else []
    earlier = path.read_bytes() if steps and path.is_file() else text.encode()
    with replacing(path, text):
        if earlier != text.encode():
            changes = config_changes(
                _recorded_settings(path, earlier, steps[-1]), config.model_dump(mode="json")
            )
            kept = path.rename(_unused_name(run_dir, f"config.before_step_{steps[-1] + 1}"))
            print(
                f"warning: resuming {run_dir} after step {steps[-1]} with changed settings ({'; '.join(changes)}); "
                f"the earlier config.yaml is kept as {kept.name}",
                file=sys.stderr,
            )


def _recorded_settings(path: Path, content: bytes, last_step: int) -> dict:
    """The settings a run dir's config.yaml records; ValueError when it holds none (e.g. cut short)."""
    try:
        settings = yaml.safe_load(content.decode())
    except (UnicodeDecodeError, yaml.YAMLError):
        settings = None
    if isinstance(settings, dict):
        return settings
    raise ValueError(
        f"{path} is {'empty' if not content.strip() else 'not a YAML mapping of settings'}, so the settings "
        f"of the checkpointed steps (up to {last_step}) are unknown; restore it, or move it aside to record "
        "this run's settings in its place"
    )


def _unused_name(run_dir: Path, stem: str) -> Path:
    """`stem.yaml`, else the first free `stem.2.yaml`, `stem.3.yaml`, ... in run_dir."""
    names = itertools.chain([f"{stem}.yaml"], (f"{stem}.{number}.yaml" for number in itertools.count(2)))
    return next(run_dir / name for name in names if not (run_dir / name).exists())


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
        if record.get("val/rollout/error_frac") == 1.0:  # a 0.000 here would read like a score
            return f"no episode completed ({_main_status(record)})"
        error = record.get(f"{key}_stderr")
        return f"{record[key]:.3f}" + (f" ± {error:.3f}" if error is not None else "")

    num_problems = int(last["val/num_problems"])
    if first is last:
        return f"held-out {key.removeprefix('val/')}: {value(last)} at step {last['step']} ({num_problems} problems)"
    return (
        f"held-out {key.removeprefix('val/')}: {value(first)} at step {first['step']} -> "
        f"{value(last)} at step {last['step']} ({num_problems} problems; ± one standard error)"
    )


def _main_status(record: dict) -> str:
    """`all <status>` or `mostly <status>` of an evaluation's episodes, from its metrics line."""
    prefix = "val/rollout/status/"
    shares = {key.removeprefix(prefix): share for key, share in record.items() if key.startswith(prefix)}
    status = max(shares, key=shares.__getitem__)
    return f"{'all' if shares[status] == 1.0 else 'mostly'} {status}"


if __name__ == "__main__":
    exit_status = main()
    if "torch.distributed" in sys.modules:  # a training run; under torchrun, one rank of several
        from agentrl.trainer.distributed import exit_rank

        exit_rank(exit_status)
    sys.exit(exit_status)
