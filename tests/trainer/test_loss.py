"""The actor loss: one formula for the whole micro-batch and for any chunk of its tokens."""

import math

import pytest
import torch

from agentrl.trainer.actor_config import ActorConfig
from agentrl.trainer.batch import TrainBatch
from agentrl.trainer.loss import METRIC_NAMES, TokenLoss, micro_batch_loss


def micro_batch(loss_mask, old_logprobs, advantages, ref_logprobs=None) -> TrainBatch:
    loss_mask = torch.tensor(loss_mask, dtype=torch.float64)
    shape = loss_mask.shape
    old_logprobs = torch.tensor(old_logprobs, dtype=torch.float64)
    return TrainBatch(
        input_ids=torch.zeros(shape, dtype=torch.long),
        attention_mask=torch.ones(shape, dtype=torch.long),
        position_ids=torch.arange(shape[1]).expand(shape).clone(),
        loss_mask=loss_mask,
        advantages=torch.tensor(advantages, dtype=torch.float64).expand(shape) * loss_mask,
        rollout_logprobs=torch.zeros(shape, dtype=torch.float64),
        group_ids=torch.arange(shape[0]),
        episode_ids=torch.arange(shape[0]),
        old_logprobs=old_logprobs,
        ref_logprobs=old_logprobs
        if ref_logprobs is None
        else torch.tensor(ref_logprobs, dtype=torch.float64),
    )


# Row 0: advantage 1, ratios 1, 1.5 (clipped at 1.28), 1. Row 1: a padding token, then advantage -2
# with ratios 0.5 (clipped at 0.8) and 4 (dual-clipped at -A * 3 = 6). Per-token policy-gradient
# losses: -1, -1.28, -1 | 1.6, 6.
HAND = micro_batch(
    loss_mask=[[1, 1, 1], [0, 1, 1]],
    old_logprobs=[[-1.0, -2.0, -0.5], [-3.0, -1.0, -0.5]],
    advantages=[[1.0], [-2.0]],
)
HAND_LOGPROBS = HAND.old_logprobs + torch.tensor(
    [[0.0, math.log(1.5), 0.0], [0.0, math.log(0.5), math.log(4.0)]], dtype=torch.float64
)
HAND_ENTROPY = torch.tensor([[0.5, 1.0, 1.5], [7.0, 2.0, 0.0]], dtype=torch.float64)


def hand_actor(**settings) -> ActorConfig:
    return ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, **settings)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 4.32 / 5),
        ("seq-mean-token-sum", (-3.28 + 7.6) / 2),
        ("seq-mean-token-mean", (-3.28 / 3 + 7.6 / 2) / 2),
        ("seq-mean-token-sum-norm", (-3.28 / 4 + 7.6 / 4) / 2),  # loss_scale_factor 4
    ],
)
def test_the_policy_gradient_loss_of_a_hand_written_batch_is_its_clipped_surrogate(mode, expected):
    actor = hand_actor(loss_agg_mode=mode, loss_scale_factor=4)
    loss, metrics = micro_batch_loss(HAND_LOGPROBS, None, HAND, actor, 5.0, 2.0)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    reported = dict(zip(METRIC_NAMES, metrics.tolist(), strict=True))
    assert reported == pytest.approx(
        {
            "actor/pg_loss": expected,
            "actor/kl_loss": 0.0,
            "actor/entropy": 0.0,
            "actor/pg_clipfrac": 2 / 5,
            "actor/pg_clipfrac_lower": 1 / 5,
            "actor/ppo_kl": -math.log(3.0) / 5,  # mean of old - new logprob over the loss tokens
        },
        rel=1e-7,  # the clip fractions are float32 means
    )


def test_the_kl_term_is_added_and_the_entropy_bonus_subtracted_with_their_coefficients():
    actor = hand_actor(use_kl_loss=True, kl_loss_type="k1", kl_loss_coef=0.1, entropy_coeff=0.01)
    loss, metrics = micro_batch_loss(HAND_LOGPROBS, HAND_ENTROPY, HAND, actor, 5.0, 2.0)
    kl_loss = math.log(1.5 * 0.5 * 4.0) / 5  # k1 against a reference equal to the old policy
    entropy = (0.5 + 1.0 + 1.5 + 2.0 + 0.0) / 5  # the padding token's 7.0 is not counted
    assert loss.item() == pytest.approx(4.32 / 5 + 0.1 * kl_loss - 0.01 * entropy, rel=1e-12)
    assert metrics[:3].tolist() == pytest.approx([4.32 / 5, kl_loss, entropy], rel=1e-12)


def test_with_entropy_coeff_0_the_entropy_is_reported_but_carries_no_gradient():
    entropy = HAND_ENTROPY.clone().requires_grad_()
    loss, metrics = micro_batch_loss(HAND_LOGPROBS, entropy, HAND, hand_actor(), 5.0, 2.0)
    assert metrics[METRIC_NAMES.index("actor/entropy")].item() == pytest.approx(1.0, rel=1e-12)
    assert not loss.requires_grad


def test_a_non_finite_value_on_a_padding_token_does_not_reach_the_loss():
    logprobs = HAND_LOGPROBS.clone()
    logprobs[1, 0] = -math.inf  # the padding token: its k1 KL is -inf
    actor = hand_actor(use_kl_loss=True, kl_loss_type="k1", kl_loss_coef=0.1)
    loss, metrics = micro_batch_loss(logprobs, None, HAND, actor, 5.0, 2.0)
    assert loss.item() == pytest.approx(4.32 / 5 + 0.1 * math.log(3.0) / 5, rel=1e-12)
    assert torch.isfinite(metrics).all()


def test_the_loss_shares_of_any_split_of_the_tokens_add_up_to_the_micro_batch_loss():
    # What the fused head relies on: it takes the loss chunk by chunk of the scored tokens.
    actor = hand_actor(use_kl_loss=True, kl_loss_type="k3+", kl_loss_coef=0.1, entropy_coeff=0.01)
    expected, _ = micro_batch_loss(HAND_LOGPROBS, HAND_ENTROPY, HAND, actor, 5.0, 2.0)
    rows, positions = (HAND.loss_mask > 0).nonzero(as_tuple=True)
    token_loss = TokenLoss.of(HAND, rows, positions, actor, 5.0, 2.0)
    logprobs, entropy = HAND_LOGPROBS[rows, positions], HAND_ENTROPY[rows, positions]
    shares = [token_loss(slice(start, start + 2), logprobs[start : start + 2], entropy[start : start + 2])
              for start in range(0, len(rows), 2)]  # fmt: skip
    assert torch.stack(shares).sum().item() == pytest.approx(expected.item(), rel=1e-12)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_the_shares_of_the_micro_batches_add_up_to_the_mini_batch_loss_and_metrics(mode):
    actor = hand_actor(loss_agg_mode=mode, use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01)
    whole = micro_batch_loss(HAND_LOGPROBS, HAND_ENTROPY, HAND, actor, 5.0, 2.0)
    parts = [
        micro_batch_loss(HAND_LOGPROBS[[row]], HAND_ENTROPY[[row]], HAND.select([row]), actor, 5.0, 2.0)
        for row in (0, 1)
    ]
    assert (parts[0][0] + parts[1][0]).item() == pytest.approx(whole[0].item(), rel=1e-12)
    assert (parts[0][1] + parts[1][1]).tolist() == pytest.approx(whole[1].tolist(), rel=1e-7)


# A fixed batch with awkward values: three rows, one padded in the middle, advantages of both signs.
FIXED = micro_batch(
    loss_mask=[[1, 1, 0, 1], [0, 1, 1, 0], [1, 1, 1, 1]],
    old_logprobs=[[-1.0, -2.5, -0.3, -0.7], [-9.0, -1.1, -0.4, -2.0], [-0.2, -3.3, -1.7, -0.9]],
    advantages=[[0.7], [-1.3], [2.1]],
    ref_logprobs=[[-0.7, -2.7, -0.3, -0.2], [-9.0, -0.7, -1.0, -2.0], [-0.1, -3.4, -1.45, -1.25]],
)
FIXED_LOGPROBS = FIXED.old_logprobs + torch.tensor(
    [[0.1, 0.6, 0.0, -0.5], [0.0, -0.45, 1.7, 0.0], [0.05, 0.3, -0.28, 0.9]], dtype=torch.float64
)
FIXED_ENTROPY = torch.tensor(
    [[0.5, 1.25, 0.0, 2.0], [0.0, 0.75, 1.5, 0.0], [0.3, 0.9, 1.1, 2.4]], dtype=torch.float64
)


@pytest.mark.parametrize(
    ("mode", "kl_loss_type", "expected_hex"),
    [
        ("token-mean", "low_var_kl", "-0x1.057f05c82c464p-1"),
        ("token-mean", None, "-0x1.24b18fcef76d7p-1"),
        ("seq-mean-token-sum", "low_var_kl", "-0x1.883e88ac42695p+0"),
        ("seq-mean-token-sum", None, "-0x1.b70a57b673242p+0"),
        ("seq-mean-token-mean", "low_var_kl", "-0x1.9e32f5ce8c3d7p-4"),
        ("seq-mean-token-mean", None, "-0x1.6583510e60ee6p-3"),
        ("seq-mean-token-sum-norm", "low_var_kl", "-0x1.883e88ac42695p-2"),
        ("seq-mean-token-sum-norm", None, "-0x1.b70a57b673242p-2"),
    ],
)
def test_the_trained_loss_of_a_fixed_batch_keeps_its_value_to_the_last_bit(mode, kl_loss_type, expected_hex):
    # The values the loss had when it was last changed on purpose: a refactor must not move a bit.
    actor = ActorConfig(
        loss_agg_mode=mode, use_kl_loss=kl_loss_type is not None, kl_loss_type=kl_loss_type or "low_var_kl",
        kl_loss_coef=0.2, entropy_coeff=0.05, clip_ratio_high=0.28,
    )  # fmt: skip
    rows, positions = (FIXED.loss_mask > 0).nonzero(as_tuple=True)
    token_loss = TokenLoss.of(FIXED, rows, positions, actor, 12.0, 4.0)
    loss = token_loss(slice(None), FIXED_LOGPROBS[rows, positions], FIXED_ENTROPY[rows, positions])
    assert loss.item().hex() == expected_hex
