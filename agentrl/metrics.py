"""Metrics stage: namespaced step metrics from trajectories, and where they are written.

Names follow verl/TRL: reward/*, response_length/*, num_turns/*, rollout/status/*, actor/*,
timing_s/*, perf/*. Every step goes to metrics.jsonl in the run dir, one line to the console,
and to Weights & Biases when enabled (offline mode when no API key is configured).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import statistics
from collections import defaultdict
from pathlib import Path

from agentrl.config import Config
from agentrl.rollout.trajectory import Status, Trajectory


def _summary(prefix: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        f"{prefix}/mean": statistics.fmean(values),
        f"{prefix}/max": max(values),
        f"{prefix}/min": min(values),
    }


def rollout_metrics(trajectories: list[Trajectory], prefix: str = "") -> dict[str, float]:
    """Reward, length, turn and status statistics of one step's trajectories."""
    valid = [t for t in trajectories if not t.status.is_error]
    rewards = [t.reward for t in valid]
    groups: dict[int, list[float]] = defaultdict(list)
    for t in valid:
        groups[t.group_id].append(t.reward)
    metrics = {
        "reward/mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward/std": statistics.pstdev(rewards) if rewards else 0.0,
        "frac_reward_zero_std": (
            sum(len(set(g)) == 1 for g in groups.values()) / len(groups) if groups else 0.0
        ),
        **_summary("response_length", [float(sum(t.loss_mask)) for t in valid]),
        **_summary("num_turns", [float(len(t.turns)) for t in valid]),
        "rollout/num_trajectories": float(len(trajectories)),
        "rollout/template_mismatch_frac": (
            sum(t.num_template_mismatches > 0 for t in trajectories) / len(trajectories)
            if trajectories
            else 0.0
        ),
    }
    metrics.update(_accuracy(valid))
    metrics.update(_env_info_means(valid))
    num = len(trajectories)
    metrics["rollout/error_frac"] = sum(t.status.is_error for t in trajectories) / num if num else 0.0
    metrics["rollout/truncated_frac"] = sum(t.status.is_truncated for t in trajectories) / num if num else 0.0
    metrics["rollout/infra_retries"] = float(sum(t.num_infra_retries for t in trajectories))
    for status in Status:
        count = sum(t.status is status for t in trajectories)
        metrics[f"rollout/status/{status.value}"] = count / len(trajectories) if trajectories else 0.0
    return {f"{prefix}{key}": value for key, value in metrics.items()}


def _accuracy(trajectories: list[Trajectory]) -> dict[str, float]:
    """Fraction correct (for envs that report info["correct"]) and its standard error over problems.

    Samples of one problem are correlated, so the error is taken over per-problem means.
    """
    by_problem: dict[int, list[bool]] = defaultdict(list)
    for t in trajectories:
        if isinstance(t.info.get("correct"), bool):
            by_problem[t.group_id].append(t.info["correct"])
    if not by_problem:
        return {}
    samples = [c for group in by_problem.values() for c in group]
    per_problem = [sum(group) / len(group) for group in by_problem.values()]
    stderr = statistics.stdev(per_problem) / len(per_problem) ** 0.5 if len(per_problem) > 1 else 0.0
    return {"accuracy": sum(samples) / len(samples), "accuracy_stderr": stderr}


def _env_info_means(trajectories: list[Trajectory]) -> dict[str, float]:
    """`env/<key>/mean` of every numeric value envs put in their final info (bools are accuracy's)."""
    values: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        for key, value in t.info.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                values[key].append(float(value))
    return {f"env/{key}/mean": statistics.fmean(found) for key, found in sorted(values.items())}


class MetricsLogger:
    """Writes step metrics to metrics.jsonl, the console and optionally Weights & Biases."""

    CONSOLE_KEYS = (
        "reward/mean",
        "val/accuracy",
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/grad_norm",
        "response_length/mean",
        "rollout/error_frac",
        "rollout/truncated_frac",
        "timing_s/step",
    )
    WANDB_ID_FILE = "wandb_run_id"

    def __init__(self, run_dir: Path, config: Config, resumed: bool, enabled: bool = True) -> None:
        """`enabled=False` (every rank but the first of a multi-process run) records nothing."""
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        if enabled:
            run_dir.mkdir(parents=True, exist_ok=True)
        trainer = config.trainer
        self.console = enabled and "console" in trainer.logger
        self.wandb_run = None
        if enabled and "wandb" in trainer.logger:
            import wandb

            if not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE"):
                os.environ["WANDB_MODE"] = "offline"
            os.environ.setdefault("WANDB_SILENT", "true")
            id_file = run_dir / self.WANDB_ID_FILE
            if not resumed or not id_file.is_file():
                id_file.write_text(secrets.token_hex(8))
            # A resumed run continues the same wandb run rather than opening a second one.
            self.wandb_run = wandb.init(
                project=trainer.project_name, name=trainer.experiment_name, dir=str(run_dir),
                config=config.model_dump(mode="json"), id=id_file.read_text().strip(), resume="allow",
            )  # fmt: skip

    def discard_after(self, step: int) -> None:
        """Forget records a resumed run will redo (after `step`); a fresh run (step 0) keeps none."""
        if not self.enabled or not self.path.exists():
            return
        records = [json.loads(line) for line in self.path.read_text().splitlines()]
        kept = [record for record in records if step > 0 and record["step"] <= step]
        self.path.write_text("".join(json.dumps(record) + "\n" for record in kept))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as handle:
            handle.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.console:
            shown = " ".join(f"{key}={metrics[key]:.4g}" for key in self.CONSOLE_KEYS if key in metrics)
            print(f"step {step}: {shown}", flush=True)
        if self.wandb_run is not None:
            self.wandb_run.log(metrics, step=step)

    def close(self) -> None:
        if self.wandb_run is not None:
            self.wandb_run.finish()


def dump_trajectories(path: Path, trajectories: list[Trajectory]) -> None:
    """One JSON object per trajectory: token ids, mask, logprobs, per-turn text, rewards, status."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for trajectory in trajectories:
            handle.write(json.dumps(trajectory.to_json()) + "\n")
