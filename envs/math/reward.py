"""Reward stage of the math env: extract the final `\\boxed{...}` answer and score it.

The answer is the content of the LAST `\\boxed{...}` in the reply (braces balanced, nested
braces allowed, escaped `\\{`/`\\}` ignored). Correctness is math_verify equivalence with the
ground truth, decided by `agentrl.rewards.answers.AnswerGrader` (the grader of the `math_accuracy`
reward too); the reward is 1.0 if correct, plus `format_reward` whenever a well-formed, non-empty
boxed answer is present.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.rewards.answers import AnswerGrader, Verdict, extract_boxed_answer


@dataclass(frozen=True)
class MathScore:
    """The reward of one reply and why."""

    reward: float  # 1.0 if correct, plus format_reward if a boxed answer is present
    correct: bool
    extracted_answer: str | None  # content of the last \boxed{...}; None when absent or malformed
    verdict: Verdict | None  # None when there was nothing to grade


def score_reply(reply: str, ground_truth: str, *, format_reward: float, grader: AnswerGrader) -> MathScore:
    """Score one assistant reply against the ground-truth answer."""
    answer = extract_boxed_answer(reply)
    if answer is None:
        return MathScore(reward=0.0, correct=False, extracted_answer=None, verdict=None)
    verdict = grader.grade(answer, ground_truth)
    correct = verdict is Verdict.CORRECT
    return MathScore(
        reward=float(correct) + format_reward,
        correct=correct,
        extracted_answer=answer,
        verdict=verdict,
    )
