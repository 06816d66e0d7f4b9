"""Loss stage: the full actor loss of one micro-batch (policy gradient + KL + entropy).

Every term is aggregated with the mini-batch's global counts, so each micro-batch returns its
share and the shares add up to the mini-batch loss:

    loss = pg_loss + kl_loss_coef * kl_loss - entropy_coeff * entropy

`micro_batch_loss` gives the loss and the metrics on [B, T] tensors. `TokenLoss` gives the same
loss as a sum over the scored tokens, which the fused head (agentrl.trainer.head_loss) needs to
take the gradient chunk by chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.algorithms.aggregation import aggregate
from agentrl.algorithms.kl import kl_penalty
from agentrl.algorithms.policy_loss import ppo_clip_loss
from agentrl.trainer.actor_config import ActorConfig
from agentrl.trainer.batch import TrainBatch

# Order of the metric shares returned by micro_batch_loss; each sums over micro-batches and ranks.
METRIC_NAMES = (
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
)


def micro_batch_loss(
    logprobs: torch.Tensor,  # [B, T] current policy, with gradient
    entropy: torch.Tensor | None,  # [B, T] entropy of each token's predicting distribution, if computed
    micro: TrainBatch,
    actor: ActorConfig,
    global_num_tokens: float,
    global_num_sequences: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # loss [], metric shares [len(METRIC_NAMES)]
    """This micro-batch's share of the mini-batch loss, and its share of each metric.

    `entropy` may be None when entropy_coeff is 0; its metric share is then 0.
    """
    assert micro.old_logprobs is not None  # checked by the caller with a user-facing error
    assert entropy is not None or actor.entropy_coeff == 0
    mask = micro.loss_mask

    def reduce(per_token: torch.Tensor) -> torch.Tensor:
        return aggregate(
            per_token,
            mask,
            actor.loss_agg_mode,
            global_num_tokens,
            global_num_sequences,
            actor.loss_scale_factor,
        )

    per_token_pg, clip = ppo_clip_loss(
        logprobs,
        micro.old_logprobs,
        micro.advantages,
        mask,
        actor.clip_ratio_low,
        actor.clip_ratio_high,
        actor.clip_ratio_c,
    )
    pg_loss = reduce(per_token_pg)
    loss = pg_loss
    entropy_term = torch.zeros((), device=logprobs.device)
    if entropy is not None:
        entropy_term = reduce(entropy)
        if actor.entropy_coeff > 0:  # otherwise a metric only: no gradient through the entropy
            loss = loss - actor.entropy_coeff * entropy_term
    kl_loss = torch.zeros((), device=logprobs.device)
    if actor.use_kl_loss:
        assert micro.ref_logprobs is not None
        kl_loss = reduce(kl_penalty(logprobs, micro.ref_logprobs, actor.kl_loss_type))
        loss = loss + actor.kl_loss_coef * kl_loss
    # Token-weighted shares, so the summed clip fractions are means over the mini-batch's tokens.
    token_share = mask.sum() / max(global_num_tokens, 1.0)
    metrics = torch.stack(
        [
            pg_loss.detach(),
            kl_loss.detach(),
            entropy_term.detach(),
            clip.pg_clipfrac * token_share,
            clip.pg_clipfrac_lower * token_share,
            clip.ppo_kl * token_share,
        ]
    )
    return loss, metrics


@dataclass(frozen=True)
class TokenLoss:
    """`micro_batch_loss`'s loss as a function of the scored tokens' logprobs and entropy.

    Every term of the loss is a per-token value times its token's aggregation weight: `aggregate`
    is linear in the per-token loss, with weights that depend only on the mask and the global
    counts. Those weights are read off as the gradient of `aggregate` (so they can never drift
    from it), and any range of tokens' share of the loss then needs nothing of the other tokens.
    Per-token values are [N] in the scored tokens' order (ScoringInputs.rows / positions).
    """

    weights: torch.Tensor  # [N] d loss / d (each token's per-token term)
    loss_mask: torch.Tensor  # [N] (ppo_clip_loss takes it for its diagnostics, which a share does not report)
    old_logprobs: torch.Tensor  # [N]
    advantages: torch.Tensor  # [N]
    ref_logprobs: torch.Tensor | None  # [N] when actor.use_kl_loss
    actor: ActorConfig

    @classmethod
    def of(
        cls,
        micro: TrainBatch,  # on the scoring device
        rows: torch.Tensor,  # [N] sequence of each scored token
        positions: torch.Tensor,  # [N] its position
        actor: ActorConfig,
        global_num_tokens: float,
        global_num_sequences: float,
    ) -> TokenLoss:
        assert micro.old_logprobs is not None  # checked by the caller with a user-facing error
        mask = micro.loss_mask
        probe = torch.zeros_like(micro.old_logprobs, requires_grad=True)
        with torch.enable_grad():
            shares = aggregate(
                probe,
                mask,
                actor.loss_agg_mode,
                global_num_tokens,
                global_num_sequences,
                actor.loss_scale_factor,
            )
            (weights,) = torch.autograd.grad(shares, probe)
        ref = micro.ref_logprobs if actor.use_kl_loss else None
        return cls(
            weights=weights[rows, positions],
            loss_mask=mask[rows, positions],
            old_logprobs=micro.old_logprobs[rows, positions],
            advantages=micro.advantages[rows, positions],
            ref_logprobs=None if ref is None else ref[rows, positions],
            actor=actor,
        )

    def __call__(self, tokens: slice, logprobs: torch.Tensor, entropy: torch.Tensor | None) -> torch.Tensor:
        """The loss share of the scored tokens in `tokens`, from their logprobs and entropy ([c] each)."""
        actor = self.actor
        weights = self.weights[tokens]
        per_token, _ = ppo_clip_loss(
            logprobs,
            self.old_logprobs[tokens],
            self.advantages[tokens],
            self.loss_mask[tokens],
            actor.clip_ratio_low,
            actor.clip_ratio_high,
            actor.clip_ratio_c,
        )
        if self.ref_logprobs is not None:
            kl = kl_penalty(logprobs, self.ref_logprobs[tokens], actor.kl_loss_type)
            per_token = per_token + actor.kl_loss_coef * kl
        if entropy is not None and actor.entropy_coeff > 0:
            per_token = per_token - actor.entropy_coeff * entropy
        return (weights * per_token).sum()
