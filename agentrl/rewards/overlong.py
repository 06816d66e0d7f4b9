"""Reward stage: DAPO's soft overlong punishment of an episode's reward.

    penalty(L) = min(-(L - (max_resp_len - buffer_len)) / buffer_len * penalty_factor, 0)

as verl's DAPO reward manager adds it to the score, with verl's max_resp_len
(`data.max_response_length`, the response budget). In a multi-turn episode the response
length L is the number of tokens the model sampled, over all its turns (and samples): the
env's and the chat template's tokens between turns are not the model's length.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class OverlongPenalty:
    """The resolved `reward.overlong_buffer` of a run."""

    max_resp_len: int  # sampled tokens at full penalty
    buffer_len: int  # the penalty ramps over the last buffer_len tokens before max_resp_len
    penalty_factor: float  # the penalty at max_resp_len

    def __call__(self, response_length: int) -> float:
        """The penalty (<= 0) of an episode that sampled `response_length` tokens."""
        expected = self.max_resp_len - self.buffer_len
        return min(-(response_length - expected) / self.buffer_len * self.penalty_factor, 0.0)


def response_length(trajectory: Trajectory) -> int:
    """Tokens the model sampled in the episode (loss mask 1 over all its samples)."""
    return sum(sum(sample.loss_mask) for sample in trajectory.samples())
