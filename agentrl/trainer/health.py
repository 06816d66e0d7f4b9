"""Metrics stage: watch each step for failing envs and biting budgets, warn, and stop a hopeless run.

A run whose episodes all fail would otherwise train on nothing and print `reward/mean=0`
for hours. A step where more than `trainer.max_error_frac` of the episodes ended in an error
status warns; `trainer.max_error_steps` such steps in a row stop the run with an error that
names the status and shows one example error. A run shorter than that whose every episode
failed stops with the same error when it ends, so that it never reads like a score. A budget
that truncates most episodes warns, and so does a step where nearly all groups have equal
rewards (every advantage 0: nothing to learn from).
"""

from __future__ import annotations

import sys

from agentrl.rollout.trajectory import Status, Trajectory

# Which knob to raise when most episodes end with this status.
BUDGET_KNOBS = {
    Status.TRUNCATED_TURNS: "rollout.max_turns",
    Status.TRUNCATED_TOKENS: "rollout.max_tokens_per_episode (or max_new_tokens_per_turn)",
    Status.TRUNCATED_TIME: "rollout.step_timeout_s / rollout.episode_timeout_s",
    Status.TRUNCATED_OBSERVATION: "rollout.max_observation_tokens (or make the env's observations shorter)",
}
MOST = 0.5
# Groups whose rewards are all equal give no learning signal. A learning run has many (the main
# job: up to 88% on some steps); nearly all means the task is out of reach, or already solved.
NO_SIGNAL = 0.9


class RunStopped(RuntimeError):
    """Training stopped because episodes kept failing; the message says which way and shows one."""


class RunHealth:
    """Counts consecutive failing steps; prints warnings to stderr."""

    def __init__(self, max_error_frac: float, max_error_steps: int) -> None:
        self.max_error_frac, self.max_error_steps = max_error_frac, max_error_steps
        self.num_failing_steps = 0
        self.num_steps = 0
        self.any_episode_finished = False  # an episode of some step ended without an error status
        self.last_failure: tuple[Status, str | None] | None = None  # worst status and an example error
        self.had_signal = True  # the previous step had groups with reward spread

    def check(self, step: int, metrics: dict[str, float], trajectories: list[Trajectory]) -> None:
        """Warn about step `step`'s metrics; raise RunStopped after too many failing steps."""
        self.num_steps += 1
        for status, knob in BUDGET_KNOBS.items():
            fraction = metrics.get(f"rollout/status/{status.value}", 0.0)
            if fraction > MOST:
                _warn(
                    f"step {step}: {fraction:.0%} of episodes ended {status.value}; if that is not intended, raise {knob}"
                )
        self._check_signal(step, metrics)
        error_frac = metrics.get("rollout/error_frac", 0.0)
        self.any_episode_finished |= error_frac < 1.0 and bool(trajectories)
        if error_frac == 0.0:
            self.num_failing_steps = 0
            return
        worst = max(
            (s for s in Status if s.is_error), key=lambda s: metrics.get(f"rollout/status/{s.value}", 0.0)
        )
        example = next((t.error for t in trajectories if t.status is worst and t.error), None)
        self.last_failure = worst, example
        if error_frac <= self.max_error_frac:
            self.num_failing_steps = 0
            return
        self.num_failing_steps += 1
        _warn(
            f"step {step}: {error_frac:.0%} of episodes failed (mostly {worst.value}), above "
            f"trainer.max_error_frac={self.max_error_frac}; they are excluded from the loss"
        )
        if self.num_failing_steps >= self.max_error_steps:
            raise RunStopped(
                f"{self.num_failing_steps} steps in a row had more than trainer.max_error_frac="
                f"{self.max_error_frac} of their episodes fail, {_failure_text(worst, example)}"
                ". Fix the env or its infrastructure, or raise trainer.max_error_frac / trainer.max_error_steps"
            )

    def finish(self) -> None:
        """At the end of training: raise RunStopped if no episode of any step ended without an error."""
        if self.num_steps == 0 or self.any_episode_finished or self.last_failure is None:
            return
        steps = f"{self.num_steps} step" + ("s" if self.num_steps > 1 else "")
        raise RunStopped(
            f"every episode of this run's {steps} failed, {_failure_text(*self.last_failure)}; "
            "nothing was trained. Fix the env or its infrastructure"
        )

    def _check_signal(self, step: int, metrics: dict[str, float]) -> None:
        """Warn when nearly all groups turn flat: equal rewards give every member advantage 0."""
        flat = metrics.get("frac_reward_zero_std", 0.0)
        has_signal = flat < NO_SIGNAL or metrics.get("rollout/error_frac", 0.0) == 1.0
        if not has_signal and self.had_signal:
            reward = metrics.get("reward/mean", 0.0)
            hint = (
                "the task is too hard for the policy: make it easier or give partial credit"
                if reward < 0.5
                else "the policy already solves it: make the task harder"
            )
            _warn(
                f"step {step}: {flat:.0%} of groups have equal rewards (reward/mean {reward:.3f}), so they "
                f"give no learning signal; {hint}, or raise rollout.n, rollout.temperature or actor.optim.lr"
            )
        self.had_signal = has_signal


def _failure_text(status: Status, example: str | None) -> str:
    return f"mostly {status.value}" + (f"; for example: {example}" if example else "")


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)
