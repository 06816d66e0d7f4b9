"""Metrics stage: watch each step for failing envs and biting budgets, warn, and stop a hopeless run.

A run whose episodes all fail would otherwise train on nothing and print `reward/mean=0`
for hours. A step where more than `trainer.max_error_frac` of the episodes ended in an error
status warns; `trainer.max_error_steps` such steps in a row stop the run with an error that
names the status and shows one example error. A budget that truncates most episodes warns too.
"""

from __future__ import annotations

import sys

from agentrl.rollout.trajectory import Status, Trajectory

# Which knob to raise when most episodes end with this status.
BUDGET_KNOBS = {
    Status.TRUNCATED_TURNS: "rollout.max_turns",
    Status.TRUNCATED_TOKENS: "rollout.max_tokens_per_episode (or max_new_tokens_per_turn)",
    Status.TRUNCATED_TIME: "rollout.step_timeout_s / rollout.episode_timeout_s",
}
MOST = 0.5


class RunStopped(RuntimeError):
    """Training stopped because episodes kept failing; the message says which way and shows one."""


class RunHealth:
    """Counts consecutive failing steps; prints warnings to stderr."""

    def __init__(self, max_error_frac: float, max_error_steps: int) -> None:
        self.max_error_frac, self.max_error_steps = max_error_frac, max_error_steps
        self.num_failing_steps = 0

    def check(self, step: int, metrics: dict[str, float], trajectories: list[Trajectory]) -> None:
        """Warn about step `step`'s metrics; raise RunStopped after too many failing steps."""
        for status, knob in BUDGET_KNOBS.items():
            fraction = metrics.get(f"rollout/status/{status.value}", 0.0)
            if fraction > MOST:
                _warn(
                    f"step {step}: {fraction:.0%} of episodes ended {status.value}; if that is not intended, raise {knob}"
                )
        error_frac = metrics.get("rollout/error_frac", 0.0)
        if error_frac <= self.max_error_frac:
            self.num_failing_steps = 0
            return
        self.num_failing_steps += 1
        worst = max(
            (s for s in Status if s.is_error), key=lambda s: metrics.get(f"rollout/status/{s.value}", 0.0)
        )
        _warn(
            f"step {step}: {error_frac:.0%} of episodes failed (mostly {worst.value}), above "
            f"trainer.max_error_frac={self.max_error_frac}; they are excluded from the loss"
        )
        if self.num_failing_steps >= self.max_error_steps:
            example = next((t.error for t in trajectories if t.status is worst and t.error), None)
            raise RunStopped(
                f"{self.num_failing_steps} steps in a row had more than trainer.max_error_frac="
                f"{self.max_error_frac} of their episodes fail, mostly {worst.value}"
                + (f"; for example: {example}" if example else "")
                + ". Fix the env or its infrastructure, or raise trainer.max_error_frac / trainer.max_error_steps"
            )


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)
