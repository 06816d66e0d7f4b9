"""Step throughput of async rollout (bounded staleness) against sync rollout, on the same workload.

Both runs train the same config for the same steps in this process, one after the other; only
`rollout.mode` differs. Step time is wall time per training step after the first (warm-up) step;
each run's step breakdown (rollout, old logprobs, update, weight sync) is the mean over those steps.

`--workload update-bound` (default: the math env, short answers) spends most of a sync step in
the update. `--workload rollout-bound` is what async rollout is for: multi-turn episodes
(`--turns` replies, each up to `--new-tokens` tokens, sampled at `--temperature` so that the
tiny policy rarely stops early) and one PPO epoch, so that rollout is most of a sync step; the
benchmark says what share it measured.

`--serve-engine` runs the engine as a server process of its own (`python -m agentrl.engine.serve`,
on `--engine-gpu` with CUDA) that both runs reach with `engine=sglang`: split placement without
Ray, the trainer on its own GPU; `--weight-sync` picks how weights reach it.

    python benchmarks/async_rollout.py                      # math env, bundled tiny policy, CPU
    python benchmarks/async_rollout.py --steps 8 trainer.device=cuda engine.device=cuda
    python benchmarks/async_rollout.py --workload rollout-bound --serve-engine --weight-sync distributed \
        --steps 8 trainer.device=cuda                       # two GPUs: trainer on 0, engine on 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentrl.config_loader import load_config
from agentrl.engine.serve.__main__ import LISTENING
from agentrl.trainer.components import build_trainer

WORKLOAD = [
    "env=math", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "rollout.n=8", "data.val_size=8",
    "trainer.logger=[console]", "trainer.val_before_train=false", "trainer.save_freq=0", "trainer.test_freq=0",
    "trainer.dump_rollouts=false", "actor.ppo_epochs=2", "algorithm.rollout_correction.rollout_is=token",
]  # fmt: skip


STAGES = ("rollout", "old_logprob", "update", "weight_sync")


def rollout_bound(turns: int, new_tokens: int, temperature: float) -> list[str]:
    """Multi-turn episodes of long replies and a light update: rollout is most of a sync step."""
    return [
        "env=multiturn", f"env.kwargs.max_attempts={turns}", f"rollout.max_turns={turns}",
        f"rollout.max_new_tokens_per_turn={new_tokens}", f"rollout.max_tokens_per_episode={turns * (new_tokens + 64) + 64}",
        f"rollout.temperature={temperature}", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "rollout.n=8",
        "data.val_size=8", "trainer.logger=[console]", "trainer.val_before_train=false", "trainer.save_freq=0",
        "trainer.test_freq=0", "trainer.dump_rollouts=false", "actor.ppo_epochs=1",
        "algorithm.rollout_correction.rollout_is=token",
    ]  # fmt: skip


def run(mode: str, steps: int, overrides: list[str], root: Path) -> tuple[float, dict[str, float]]:
    """Seconds per step after the first, and the mean of each stage's seconds over those steps."""
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
    timed = [record for record in records if record["step"] > 1]
    breakdown = {
        stage: sum(record.get(f"timing_s/{stage}", 0.0) for record in timed) / len(timed) for stage in STAGES
    }
    breakdown["staleness"] = timed[-1].get("rollout/staleness/mean", 0.0)
    return sum(record["timing_s/step"] for record in timed) / len(timed), breakdown


def start_engine_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """`python -m agentrl.engine.serve` with the tiny policy, on --engine-gpu when CUDA is there."""
    env = dict(os.environ)
    device = "cpu"
    if args.engine_gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(args.engine_gpu)
        device = "cuda"
    command = [
        sys.executable,
        "-m",
        "agentrl.engine.serve",
        "--model",
        "tiny",
        "--port",
        "0",
        "--device",
        device,
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in process.stdout:
        if line.startswith(LISTENING):
            return process, line.split()[len(LISTENING.split())]
    process.wait()
    raise SystemExit("the engine server exited before listening")


def describe(name: str, seconds: float, breakdown: dict[str, float]) -> str:
    stages = ", ".join(f"{stage} {breakdown[stage]:.3f} s" for stage in STAGES)
    return (
        f"{name}: {seconds:.3f} s/step ({stages}; rollout {breakdown['rollout'] / seconds:.0%} of the step)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="training steps per mode (the first is warm-up)")
    parser.add_argument("--workload", choices=["update-bound", "rollout-bound"], default="update-bound")
    parser.add_argument("--turns", type=int, default=4, help="rollout-bound: replies per episode")
    parser.add_argument("--new-tokens", type=int, default=128, help="rollout-bound: tokens per reply at most")
    parser.add_argument("--temperature", type=float, default=1.5, help="rollout-bound: sampling temperature")
    parser.add_argument(
        "--serve-engine", action="store_true", help="the engine in a server process of its own"
    )
    parser.add_argument(
        "--engine-gpu", type=int, default=None, help="--serve-engine: the server's CUDA card (default: CPU)"
    )
    parser.add_argument(
        "--weight-sync",
        choices=["disk", "distributed"],
        default="disk",
        help="--serve-engine: engine.weight_sync",
    )
    parser.add_argument("overrides", nargs="*", help="extra config overrides for both runs")
    args = parser.parse_args()
    workload = (
        WORKLOAD
        if args.workload == "update-bound"
        else rollout_bound(args.turns, args.new_tokens, args.temperature)
    )
    server = None
    if args.serve_engine:
        server, url = start_engine_server(args)
        workload = [*workload, "engine=sglang", f"engine.url={url}", f"engine.weight_sync={args.weight_sync}"]
    try:
        with tempfile.TemporaryDirectory() as root:
            started = time.perf_counter()
            overrides = [*workload, *args.overrides]
            sync_seconds, sync_stages = run("sync", args.steps, overrides, Path(root))
            async_seconds, async_stages = run(
                "async", args.steps, [*overrides, "rollout.max_staleness=1"], Path(root)
            )
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
    print(f"workload: {' '.join(workload + args.overrides)}")
    print(describe("sync ", sync_seconds, sync_stages))
    print(
        describe("async", async_seconds, async_stages)
        + f", max_staleness=1, staleness mean {async_stages['staleness']:.2f}"
    )
    share = sync_stages["rollout"] / sync_seconds
    if args.workload == "rollout-bound" and share < 0.6:
        print(f"note: rollout is {share:.0%} of a sync step, under 60%: raise --turns or --new-tokens")
    print(
        f"ratio async / sync step throughput: {sync_seconds / async_seconds:.2f}x  ({time.perf_counter() - started:.0f} s in all)"
    )


if __name__ == "__main__":
    main()
