"""Step throughput of async rollout (bounded staleness) against sync rollout, on the same workload.

Both runs train the same config for the same steps in this process, one after the other; only
`rollout.mode` differs. Step time is wall time per training step after the first (warm-up) step.

    python benchmarks/async_rollout.py                      # math env, bundled tiny policy, CPU
    python benchmarks/async_rollout.py --steps 8 trainer.device=cuda engine.device=cuda
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from agentrl.config_loader import load_config
from agentrl.trainer.components import build_trainer

WORKLOAD = [
    "env=math", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "rollout.n=8", "data.val_size=8",
    "trainer.logger=[console]", "trainer.val_before_train=false", "trainer.save_freq=0", "trainer.test_freq=0",
    "trainer.dump_rollouts=false", "actor.ppo_epochs=2", "algorithm.rollout_correction.rollout_is=token",
]  # fmt: skip


def run(mode: str, steps: int, overrides: list[str], root: Path) -> tuple[float, dict]:
    """Seconds per step after the first, and the last step's metrics."""
    run_dir = root / mode
    config = load_config(
        [
            *WORKLOAD,
            *overrides,
            f"rollout.mode={mode}",
            f"trainer.total_training_steps={steps}",
            f"trainer.run_dir={run_dir}",
        ]
    )
    trainer = build_trainer(config, run_dir)
    asyncio.run(trainer.fit())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step_seconds = [record["timing_s/step"] for record in records if record["step"] > 1]
    return sum(step_seconds) / len(step_seconds), records[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="training steps per mode (the first is warm-up)")
    parser.add_argument("overrides", nargs="*", help="extra config overrides for both runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        started = time.perf_counter()
        sync_seconds, sync_last = run("sync", args.steps, args.overrides, Path(root))
        async_seconds, async_last = run(
            "async", args.steps, [*args.overrides, "rollout.max_staleness=1"], Path(root)
        )
    print(f"workload: {' '.join(WORKLOAD + args.overrides)}")
    print(
        f"sync:  {sync_seconds:.3f} s/step (rollout {sync_last['timing_s/rollout']:.3f} s, "
        f"update {sync_last['timing_s/update']:.3f} s in the last step)"
    )
    print(
        f"async: {async_seconds:.3f} s/step, max_staleness=1 "
        f"(staleness mean {async_last.get('rollout/staleness/mean', 0):.2f} in the last step)"
    )
    print(
        f"ratio async / sync step throughput: {sync_seconds / async_seconds:.2f}x  ({time.perf_counter() - started:.0f} s in all)"
    )


if __name__ == "__main__":
    main()
