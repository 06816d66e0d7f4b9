"""The math environment: arithmetic and competition math answered in `\\boxed{}`."""

from agentrl.rewards.answers import AnswerGrader, Verdict
from envs.math.env import FEEDBACK, MathEnv
from envs.math.reward import MathScore, extract_boxed_answer, score_reply

__all__ = [
    "FEEDBACK",
    "AnswerGrader",
    "MathEnv",
    "MathScore",
    "Verdict",
    "extract_boxed_answer",
    "score_reply",
]
