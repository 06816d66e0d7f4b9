"""Loss stage: the full actor loss of one micro-batch (policy gradient + KL + entropy).

Every term is aggregated with the mini-batch's global counts, so each micro-batch returns its
share and the shares add up to the mini-batch loss:

    loss = pg_loss + kl_loss_coef * kl_loss - entropy_coeff * entropy

`actor_loss` is that formula, written once. Every aggregation mode is linear in the per-token
loss (agentrl.algorithms.aggregation), so the loss is a weighted sum of per-token terms,
`sum_t w_t (pg_t + kl_loss_coef * kl_t - entropy_coeff * entropy_t)`, with weights that depend
only on the loss mask and the global counts. `TokenLoss` holds those weights and the other fixed
per-token inputs; any subset of the tokens then has its own share of the loss and of each metric,
needing nothing of the other tokens. The fused head (agentrl.trainer.head_loss) takes the
gradient chunk by chunk through `TokenLoss.__call__`; `micro_batch_loss` gives the loss and the
metrics on [B, T] tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.algorithms.aggregation import aggregate
from agentrl.algorithms.kl import kl_penalty
from agentrl.algorithms.policy_loss import ppo_clip_loss
from agentrl.trainer.actor_config import ActorConfig
from agentrl.trainer.batch import TrainBatch

# Order of the metric shares returned by actor_loss; each sums over tokens, micro-batches and ranks.
METRIC_NAMES = (
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
)


@dataclass(frozen=True)
class TokenLoss:
    """The fixed per-token inputs of the actor loss; calling it gives a range of tokens' loss share.

    Tensors have one shape: [N] over the scored tokens in their order (ScoringInputs.rows /
    positions), or [B, T] over a whole micro-batch (`over_micro_batch`).
    """

    weights: torch.Tensor  # d loss / d (each token's per-token term): its aggregation weight
    loss_mask: torch.Tensor  # 1 on tokens that carry loss
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    ref_logprobs: torch.Tensor | None  # when actor.use_kl_loss
    actor: ActorConfig
    global_num_tokens: float  # the mini-batch's loss tokens, over every micro-batch and rank

    @classmethod
    def over_micro_batch(
        cls,
        micro: TrainBatch,
        actor: ActorConfig,
        global_num_tokens: float,
        global_num_sequences: float,
        sequence_num_tokens: torch.Tensor | None = None,  # [B] each row's episode's loss tokens
    ) -> TokenLoss:
        """[B, T] inputs of every position of `micro`; the counts as in agentrl.algorithms.aggregation."""
        assert micro.old_logprobs is not None  # checked by the caller with a user-facing error
        assert not actor.use_kl_loss or micro.ref_logprobs is not None
        mask = micro.loss_mask
        # The weights are read off as the gradient of `aggregate`, so they can never drift from it.
        probe = torch.zeros_like(micro.old_logprobs, requires_grad=True)
        with torch.enable_grad():
            shares = aggregate(
                probe,
                mask,
                actor.loss_agg_mode,
                global_num_tokens,
                global_num_sequences,
                actor.loss_scale_factor,
                sequence_num_tokens,
            )
            (weights,) = torch.autograd.grad(shares, probe)
        return cls(
            weights=weights,
            loss_mask=mask,
            old_logprobs=micro.old_logprobs,
            advantages=micro.advantages,
            ref_logprobs=micro.ref_logprobs if actor.use_kl_loss else None,
            actor=actor,
            global_num_tokens=global_num_tokens,
        )

    @classmethod
    def of(
        cls,
        micro: TrainBatch,  # on the scoring device
        rows: torch.Tensor,  # [N] sequence of each scored token
        positions: torch.Tensor,  # [N] its position
        actor: ActorConfig,
        global_num_tokens: float,
        global_num_sequences: float,
        sequence_num_tokens: torch.Tensor | None = None,  # [B] each row's episode's loss tokens
    ) -> TokenLoss:
        """[N] inputs of the scored tokens of `micro`."""
        full = cls.over_micro_batch(
            micro, actor, global_num_tokens, global_num_sequences, sequence_num_tokens
        )
        return full._select((rows, positions))

    def __call__(self, tokens: slice, logprobs: torch.Tensor, entropy: torch.Tensor | None) -> torch.Tensor:
        """The loss share of the scored tokens in `tokens`, from their logprobs and entropy ([c] each)."""
        loss, _ = actor_loss(logprobs, entropy, self._select(tokens))
        return loss

    def _select(self, index: slice | tuple[torch.Tensor, torch.Tensor]) -> TokenLoss:
        return TokenLoss(
            weights=self.weights[index],
            loss_mask=self.loss_mask[index],
            old_logprobs=self.old_logprobs[index],
            advantages=self.advantages[index],
            ref_logprobs=None if self.ref_logprobs is None else self.ref_logprobs[index],
            actor=self.actor,
            global_num_tokens=self.global_num_tokens,
        )


def actor_loss(
    logprobs: torch.Tensor,  # current policy, with gradient; the shape of `inputs`' tensors
    entropy: torch.Tensor | None,  # entropy of each token's predicting distribution, if computed
    inputs: TokenLoss,
) -> tuple[torch.Tensor, torch.Tensor]:  # loss share [], metric shares [len(METRIC_NAMES)]
    """These tokens' share of the mini-batch loss, and their share of each metric.

    `entropy` may be None when entropy_coeff is 0; its metric share is then 0. With entropy_coeff
    0 the entropy is a metric only: no gradient flows through it.
    """
    actor = inputs.actor
    assert entropy is not None or actor.entropy_coeff == 0
    per_token_pg, clip = ppo_clip_loss(
        logprobs,
        inputs.old_logprobs,
        inputs.advantages,
        inputs.loss_mask,
        actor.clip_ratio_low,
        actor.clip_ratio_high,
        actor.clip_ratio_c,
    )
    per_token = per_token_pg
    kl = None
    if inputs.ref_logprobs is not None:
        kl = kl_penalty(logprobs, inputs.ref_logprobs, actor.kl_loss_type)
        per_token = per_token + actor.kl_loss_coef * kl
    if entropy is not None and actor.entropy_coeff > 0:
        per_token = per_token - actor.entropy_coeff * entropy

    def weighted_sum(values: torch.Tensor) -> torch.Tensor:
        # where(), not a product: a non-finite value on a token without loss must not turn into NaN.
        return torch.where(inputs.weights != 0, inputs.weights * values, 0.0).sum()

    loss = weighted_sum(per_token)
    with torch.no_grad():
        zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
        # Token-weighted shares, so the summed clip fractions are means over the mini-batch's tokens.
        token_share = inputs.loss_mask.sum() / max(inputs.global_num_tokens, 1.0)
        metrics = torch.stack(
            [
                weighted_sum(per_token_pg),
                zero if kl is None else weighted_sum(kl),
                zero if entropy is None else weighted_sum(entropy),
                clip.pg_clipfrac * token_share,
                clip.pg_clipfrac_lower * token_share,
                clip.ppo_kl * token_share,
            ]
        )
    return loss, metrics


def micro_batch_loss(
    logprobs: torch.Tensor,  # [B, T] current policy, with gradient
    entropy: torch.Tensor | None,  # [B, T] entropy of each token's predicting distribution, if computed
    micro: TrainBatch,
    actor: ActorConfig,
    global_num_tokens: float,
    global_num_sequences: float,
    sequence_num_tokens: torch.Tensor | None = None,  # [B] each row's episode's loss tokens
) -> tuple[torch.Tensor, torch.Tensor]:  # loss [], metric shares [len(METRIC_NAMES)]
    """`actor_loss` over every position of a micro-batch."""
    inputs = TokenLoss.over_micro_batch(
        micro, actor, global_num_tokens, global_num_sequences, sequence_num_tokens
    )
    return actor_loss(logprobs, entropy, inputs)
