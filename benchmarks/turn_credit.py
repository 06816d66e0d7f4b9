"""Turn-level credit against episode-level credit on the code env with a feedback turn.

Both runs train the same config, steps and seeds in this process, one after the other; only
`algorithm.adv_granularity` differs. The code env gives a second turn after failing visible
tests (`env.kwargs.max_turns=2 rollout.max_turns=2`); its reward comes at the end, so turn credit
differs from episode credit exactly on the second turns, compared only among the episodes that
needed one. Prints each run's training reward per step, held-out accuracy, and turn / episode
ratios of the mean training reward over the steps after the first and of the final accuracy.

    python benchmarks/turn_credit.py                              # bundled tiny policy, CPU, small
    python benchmarks/turn_credit.py --steps 30 data.train_batch_size=16 rollout.n=8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from agentrl.config_loader import load_config
from agentrl.trainer.components import build_trainer

WORKLOAD = [
    "env=code_sandbox", "env.kwargs.max_turns=2", "rollout.max_turns=2", "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=4", "rollout.n=4", "data.val_size=8", "rollout.val_kwargs.n=2",
    "trainer.logger=[console]", "trainer.save_freq=0", "trainer.dump_rollouts=false",
]  # fmt: skip


def run(granularity: str, steps: int, overrides: list[str], root: Path) -> list[dict]:
    """The metrics records of one training run (step 0 is the evaluation before training)."""
    run_dir = root / granularity
    config = load_config(
        [*WORKLOAD, *overrides, f"algorithm.adv_granularity={granularity}",
         f"trainer.total_training_steps={steps}", f"trainer.test_freq={steps}", f"trainer.run_dir={run_dir}"]
    )  # fmt: skip
    asyncio.run(build_trainer(config, run_dir).fit())
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary(records: list[dict]) -> tuple[list[float], float, float]:
    """Training reward per step, its mean over the steps after the first, the final held-out accuracy."""
    rewards = [record["reward/mean"] for record in records if record["step"] > 0]
    return rewards, statistics.fmean(rewards[1:] or rewards), records[-1]["val/accuracy"]


def ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.3f}x" if baseline else "n/a (baseline 0)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps per run")
    parser.add_argument("overrides", nargs="*", help="extra config overrides for both runs")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        episode = summary(run("episode", args.steps, args.overrides, Path(root)))
        turn = summary(run("turn", args.steps, args.overrides, Path(root)))
    print(f"workload: {' '.join(WORKLOAD + args.overrides)} --steps {args.steps}")
    for name, (rewards, mean_reward, accuracy) in (("episode", episode), ("turn", turn)):
        curve = " ".join(f"{reward:.3f}" for reward in rewards)
        print(
            f"{name:8s} reward by step: {curve}  mean after step 1: {mean_reward:.3f}  val/accuracy: {accuracy:.3f}"
        )
    print(
        f"turn / episode: mean reward {ratio(turn[1], episode[1])}, val/accuracy {ratio(turn[2], episode[2])}"
    )
    print(f"wall time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
