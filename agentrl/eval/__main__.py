"""Entry point: `python -m agentrl.eval [group=preset ...] [key.sub=value ...] [--k 1,4] [--output PATH]`.

The same presets and overrides as `python -m agentrl.train`: `env=code_sandbox
model.path=runs/code_sandbox/hf_model` evaluates a trained policy with the built-in engine,
`engine=sglang engine.url=http://HOST:PORT` a served one. Each held-out row is sampled
`rollout.val_kwargs.n` times at `rollout.val_kwargs.temperature`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentrl.config_loader import ConfigError, config_groups, load_config


def parse_args(argv: list[str]) -> argparse.Namespace:
    presets = "; ".join(f"{group}={'|'.join(names)}" for group, names in sorted(config_groups().items()))
    parser = argparse.ArgumentParser(
        prog="python -m agentrl.eval",
        description="Score a policy on held-out rows: pass@k per env and success by turn. Example: "
        "python -m agentrl.eval env=math model.path=runs/math/hf_model rollout.val_kwargs.n=8 --k 1,8",
        epilog=f"Presets: {presets}.",
    )
    parser.add_argument(
        "overrides", nargs="*", help="config group presets (env=math) and key=value overrides"
    )
    parser.add_argument(
        "--k", default=None, metavar="K1,K2",
        help="pass@k for these k (each at most rollout.val_kwargs.n); default: 1 and rollout.val_kwargs.n",
    )  # fmt: skip
    parser.add_argument(
        "--output", type=Path, default=None,
        help="JSON file of the scores; default: eval.json in the run dir (trainer.run_dir, else runs/<experiment_name>)",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = load_config(args.overrides)
        ks = _ks(args.k, config.rollout.val_kwargs.n)
    except (ConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # Heavy imports only after the config is known to be valid.
    from agentrl.engine.remote.sglang_protocol import EngineRequestError
    from agentrl.eval.report import scores_record, scores_table, write_scores
    from agentrl.eval.run import evaluate

    output = (
        args.output or Path(config.trainer.run_dir or f"runs/{config.trainer.experiment_name}") / "eval.json"
    )
    try:
        result = evaluate(config, ks)
    except (
        ValueError,
        EngineRequestError,
    ) as error:  # a bad model path or env, an engine that does not answer
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(scores_table(result.scores))
    settings = {
        "model": config.model.path,
        "engine": config.engine.backend,
        "samples_per_problem": config.rollout.val_kwargs.n,
        "temperature": config.rollout.val_kwargs.temperature,
    }
    write_scores(output, scores_record(result.scores, settings))
    print(f"scores: {output}")
    return 0


def _ks(text: str | None, num_samples: int) -> list[int]:
    """The k of pass@k: parsed from --k, each between 1 and the samples per problem."""
    from sandbox.passk import parse_ks

    ks = parse_ks(text) if text is not None else sorted({1, num_samples})
    too_large = [k for k in ks if k > num_samples]
    if too_large:
        raise ValueError(
            f"--k {too_large[0]} needs at least {too_large[0]} samples per problem, but "
            f"rollout.val_kwargs.n={num_samples}; raise rollout.val_kwargs.n or lower k"
        )
    return ks


if __name__ == "__main__":
    sys.exit(main())
