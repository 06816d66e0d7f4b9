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
import sys
from collections import defaultdict
from pathlib import Path

from agentrl.config import Config
from agentrl.rollout.trajectory import Status, Trajectory
from agentrl.run_files import append_line, write_atomically


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
    scored = [t for t in valid if not t.reward_missing]  # as in the advantages: unscored is not 0
    rewards = [t.reward for t in scored]
    groups: dict[int, list[float]] = defaultdict(list)
    for t in scored:
        groups[t.group_id].append(t.reward)
    metrics = {
        "reward/mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward/mean_stderr": _stderr_over_problems(list(groups.values())),
        "reward/std": statistics.pstdev(rewards) if rewards else 0.0,
        "frac_reward_zero_std": (
            sum(len(set(g)) == 1 for g in groups.values()) / len(groups) if groups else 0.0
        ),
        **_summary("response_length", [float(sum(sum(s.loss_mask) for s in t.samples())) for t in valid]),
        **_summary("num_turns", [float(len(t.turns)) for t in valid]),
        "rollout/num_trajectories": float(len(trajectories)),
        # rollout.trajectory_mode=single only: episodes that trained tokens differing from the render.
        "rollout/template_mismatch_frac": (
            sum(t.num_template_mismatches > 0 for t in trajectories) / len(trajectories)
            if trajectories
            else 0.0
        ),
        # Episodes whose history was rewritten train as several samples (agentrl.rollout.episode).
        "rollout/samples_per_episode": (statistics.fmean(len(t.samples()) for t in valid) if valid else 0.0),
        "rollout/split_episode_fraction": (
            sum(bool(t.earlier_segments) for t in valid) / len(valid) if valid else 0.0
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
    return {
        "accuracy": sum(samples) / len(samples),
        "accuracy_stderr": _stderr_over_problems(list(by_problem.values())),
    }


def _stderr_over_problems(groups: list[list[float]]) -> float:
    """Standard error of the mean over problems (each group: one problem's samples, correlated)."""
    per_problem = [statistics.fmean(group) for group in groups if group]
    return statistics.stdev(per_problem) / len(per_problem) ** 0.5 if len(per_problem) > 1 else 0.0


def _env_info_means(trajectories: list[Trajectory]) -> dict[str, float]:
    """`env/<key>/mean` of every numeric value envs put in their final info (bools are accuracy's)."""
    values: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        for key, value in t.info.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                number = value if isinstance(value, float) else _int_as_float(value)
                if math.isfinite(number):
                    values[key].append(number)
    return {f"env/{key}/mean": _overflow_free_mean(found) for key, found in sorted(values.items())}


def _int_as_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond float range has no finite mean
        return math.inf


def _overflow_free_mean(values: list[float]) -> float:
    try:
        return statistics.fmean(values)
    except OverflowError:  # finite values near the float maximum: divide before summing
        return math.fsum(value / len(values) for value in values)


def read_metrics(path: Path) -> tuple[list[dict], list[int]]:
    """The step records of a metrics.jsonl, and the byte offsets of lines that are not whole records."""
    records, torn_offsets, offset = [], [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        try:
            record = json.loads(line)
        except ValueError:  # part of a line (JSON or UTF-8 cut short)
            record = None
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
        elif line.strip():
            torn_offsets.append(offset)
        offset += len(line)
    return records, torn_offsets


def _duration(seconds: float) -> str:
    """`1h02m`, `3m05s` or `42s`."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


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
        self.total_steps = trainer.total_training_steps
        self.step_seconds: list[float] = []  # wall clock of each step this process ran
        self.wandb_run = None
        if enabled and "wandb" in trainer.logger:
            import wandb

            if not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE"):
                os.environ["WANDB_MODE"] = "offline"
            os.environ.setdefault("WANDB_SILENT", "true")
            id_file = run_dir / self.WANDB_ID_FILE
            if not resumed or not id_file.is_file() or not id_file.read_text().strip():
                write_atomically(id_file, secrets.token_hex(8))
            # A resumed run continues the same wandb run rather than opening a second one.
            self.wandb_run = wandb.init(
                project=trainer.project_name, name=trainer.experiment_name, dir=str(run_dir),
                config=config.model_dump(mode="json"), id=id_file.read_text().strip(), resume="allow",
            )  # fmt: skip

    def discard_after(self, step: int) -> None:
        """Forget records a resumed run will redo (after `step`); a fresh run (step 0) keeps none.

        A line that is not a whole record (a write cut short by an earlier version on a full
        disk) is dropped with a warning naming where it was.
        """
        if not self.enabled or not self.path.exists():
            return
        records, torn_offsets = read_metrics(self.path)
        for offset in torn_offsets:
            print(
                f"warning: {self.path}: dropped an incomplete record at byte {offset} "
                "(a write cut short, e.g. by a full disk)",
                file=sys.stderr,
            )
        kept = [record for record in records if step > 0 and record["step"] <= step]
        if torn_offsets or len(kept) < len(records):
            write_atomically(self.path, "".join(json.dumps(record) + "\n" for record in kept))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record one step; its line is on disk whole once this returns, and absent if it raises."""
        if not self.enabled:
            return
        append_line(self.path, json.dumps({"step": step, **metrics}) + "\n")
        if self.console:
            shown = " ".join(f"{key}={metrics[key]:.4g}" for key in self.CONSOLE_KEYS if key in metrics)
            print(f"{self._progress(step, metrics)}: {shown}", flush=True)
        if self.wandb_run is not None:
            self.wandb_run.log(metrics, step=step)

    def _progress(self, step: int, metrics: dict[str, float]) -> str:
        """`step N/T` and, for a training step, the time left at this process's mean step time."""
        if step == 0:  # the evaluation before training
            return "step 0"
        self.step_seconds.append(metrics.get("timing_s/step", 0.0))
        remaining = self.total_steps - step
        eta_s = remaining * statistics.fmean(self.step_seconds)
        return f"step {step}/{self.total_steps} (eta {_duration(eta_s)})"

    def close(self) -> None:
        if self.wandb_run is not None:
            self.wandb_run.finish()


def dump_trajectories(path: Path, trajectories: list[Trajectory]) -> None:
    """One JSON object per trajectory: token ids, mask, logprobs, per-turn text, rewards, status."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for trajectory in trajectories:
            handle.write(json.dumps(trajectory.to_json()) + "\n")
