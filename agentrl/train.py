"""Entry point: `python -m agentrl.train [group=preset ...] [key.sub=value ...] [--print-config]`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from agentrl.config_loader import ConfigError, dump_config, load_config


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m agentrl.train",
        description="Train a policy with GRPO-family RL. Example: python -m agentrl.train env=math rollout.n=8",
    )
    parser.add_argument("overrides", nargs="*", help="config group presets (env=math) and key=value overrides")
    parser.add_argument("--print-config", action="store_true", help="print the fully resolved config and exit")
    return parser.parse_args(argv)


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
    # Heavy imports only after the config is known to be valid.
    from agentrl.trainer.components import build_components
    from agentrl.trainer.loop import Trainer

    run_dir = Path(config.trainer.run_dir or f"runs/{config.trainer.experiment_name}")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(config))
    trainer = Trainer(config, build_components(config, run_dir))
    final = asyncio.run(trainer.fit())
    print(f"run dir: {run_dir}  final policy: {run_dir / 'hf_model'}")
    summary = {key: value for key, value in final.items() if key.startswith("val/")}
    print("final evaluation: " + " ".join(f"{key}={value:.4g}" for key, value in sorted(summary.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
