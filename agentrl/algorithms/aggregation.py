"""Loss stage: reduce a per-token loss [B, T] to the scalar a micro-batch contributes.

All counts are GLOBAL: taken over the whole mini-batch, i.e. every micro-batch on every
data-parallel rank. Each micro-batch's result is its share, so the sum of the results over
micro-batches and ranks is the mini-batch loss, whatever the micro-batch size or the number
of ranks.

A "sequence" i is an episode. An episode whose history was rewritten is trained as several rows
(samples, agentrl.rollout.trajectory.Segment); it is still one sequence: its token sums span all
its rows, and N_seq counts it once. With m the loss mask, l the per-token loss, t running over
every row of the episode, N_tok the global number of loss tokens, N_seq the global number of
episodes with at least one loss token and L the scale factor:

    token-mean               sum_{i,t} m_it l_it / N_tok
                             (DAPO: every token weighs the same, whatever its sequence's length)
    seq-mean-token-sum       sum_i (sum_t m_it l_it) / N_seq
    seq-mean-token-mean      sum_i (sum_t m_it l_it / sum_t m_it) / N_seq
                             (the original GRPO objective)
    seq-mean-token-sum-norm  sum_i (sum_t m_it l_it / L) / N_seq
                             (Dr.GRPO: a constant L, e.g. the generation budget, in place of
                             each sequence's length, so no length bias)

So an episode split into two samples has the loss of the same tokens in one row, in every mode.
Row by row this is: a row's token sum, divided by its episode's loss tokens
(`sequence_num_tokens`, for seq-mean-token-mean) or by L, summed and divided by N_seq.
`sequence_counts` computes both counts over the mini-batch, before it is split.

L is `loss_scale_factor`; None means the padded length T of the tensor, which only stays
constant across micro-batches when they share one padded length (the policy worker pads
every micro-batch of a step to the same T). Set it to the response budget to keep the
normalisation constant across steps too.
"""

from __future__ import annotations

import torch

from agentrl.algorithms.config import LOSS_AGG_MODES, LossAggMode

__all__ = ["LOSS_AGG_MODES", "LossAggMode", "aggregate", "sequence_counts"]


def sequence_counts(
    loss_mask: torch.Tensor,  # [B, T] of the whole mini-batch
    sequence_ids: torch.Tensor,  # [B] episode of each row
) -> tuple[torch.Tensor, float]:  # ([B] loss tokens of each row's episode, N_seq)
    """The global per-episode counts of a mini-batch: each row's episode's loss tokens, and the
    number of episodes with at least one loss token."""
    row_tokens = loss_mask.sum(dim=-1)  # [B]
    episodes, episode_of_row = torch.unique(sequence_ids, return_inverse=True)
    episode_tokens = torch.zeros(len(episodes), dtype=row_tokens.dtype, device=row_tokens.device)
    episode_tokens = episode_tokens.index_add(0, episode_of_row, row_tokens)
    return episode_tokens[episode_of_row], float((episode_tokens > 0).sum())


def aggregate(
    per_token_loss: torch.Tensor,  # [B, T]
    loss_mask: torch.Tensor,  # [B, T] 1 on tokens that carry loss
    mode: str,
    global_num_tokens: float,
    global_num_sequences: float,
    loss_scale_factor: int | None = None,
    sequence_num_tokens: torch.Tensor | None = None,  # [B] each row's episode's loss tokens; None: its own
) -> torch.Tensor:  # []
    """This micro-batch's share of the mini-batch loss under `mode` (formulas in the module doc)."""
    if per_token_loss.shape != loss_mask.shape or per_token_loss.dim() != 2:
        raise ValueError(
            f"per_token_loss and loss_mask must both be [B, T]; got {tuple(per_token_loss.shape)} "
            f"and {tuple(loss_mask.shape)}"
        )
    if sequence_num_tokens is not None and sequence_num_tokens.shape != loss_mask.shape[:1]:
        raise ValueError(
            f"sequence_num_tokens must be [B] = [{loss_mask.shape[0]}], got {tuple(sequence_num_tokens.shape)}"
        )
    mask = loss_mask.to(per_token_loss.dtype)
    # where(), not a product: a non-finite loss on a padding token must not turn into NaN.
    masked = torch.where(loss_mask > 0, per_token_loss, torch.zeros_like(per_token_loss))
    # An empty mini-batch contributes 0; max(.., 1) keeps that a 0 instead of a NaN.
    if mode == "token-mean":
        return masked.sum() / max(global_num_tokens, 1)
    token_sums = masked.sum(dim=-1)  # [B]
    if mode == "seq-mean-token-sum":
        per_sequence = token_sums
    elif mode == "seq-mean-token-mean":
        lengths = mask.sum(dim=-1) if sequence_num_tokens is None else sequence_num_tokens.to(mask.dtype)
        per_sequence = token_sums / lengths.clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        scale = per_token_loss.shape[-1] if loss_scale_factor is None else loss_scale_factor
        if scale <= 0:
            raise ValueError(f"loss_scale_factor must be a positive integer or None, got {loss_scale_factor}")
        per_sequence = token_sums / scale
    else:
        raise ValueError(f"loss_agg_mode must be one of {', '.join(LOSS_AGG_MODES)}; got {mode!r}")
    return per_sequence.sum() / max(global_num_sequences, 1)
