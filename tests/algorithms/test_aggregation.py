import pytest
import torch

from agentrl.algorithms import LOSS_AGG_MODES, aggregate, kl_penalty, ppo_clip_loss
from agentrl.algorithms.aggregation import sequence_counts

LOSS = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 5.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
# sequence sums 6 and 9, lengths 3 and 2: 5 tokens, 2 sequences, padded length 4


@pytest.mark.parametrize(
    ("mode", "scale", "expected"),
    [
        ("token-mean", None, 15 / 5),
        ("seq-mean-token-sum", None, (6 + 9) / 2),
        ("seq-mean-token-mean", None, (6 / 3 + 9 / 2) / 2),
        ("seq-mean-token-sum-norm", None, (6 / 4 + 9 / 4) / 2),
        ("seq-mean-token-sum-norm", 10, (6 / 10 + 9 / 10) / 2),
    ],
)
def test_each_mode_follows_its_formula(mode, scale, expected):
    assert aggregate(LOSS, MASK, mode, 5, 2, scale).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_shares_add_up_to_the_whole_batch_loss(mode):
    whole = aggregate(LOSS, MASK, mode, 5, 2)
    shares = aggregate(LOSS[:1], MASK[:1], mode, 5, 2) + aggregate(LOSS[1:], MASK[1:], mode, 5, 2)
    assert shares.item() == pytest.approx(whole.item())


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_padding_tokens_never_contribute_even_when_not_finite(mode):
    loss = torch.tensor([[2.0, float("inf")], [float("nan"), 4.0]])
    mask = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert aggregate(loss, mask, mode, 2, 2, loss_scale_factor=1).item() == 3.0


def test_an_unknown_mode_is_rejected_with_the_valid_modes():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(LOSS, MASK, "token-sum", 5, 2)


def _loss_gradient(micro_batch_size: int, mode: str) -> torch.Tensor:
    """Gradient of the full loss (PPO + k3 KL) w.r.t. logprobs, accumulated over micro-batches."""
    logprobs = torch.tensor(
        [[0.0, -1.0, -0.5, -2.0], [0.0, -0.3, -0.7, 0.0], [0.0, -1.2, 0.0, 0.0], [0.0, -0.1, -0.2, -0.4]],
        requires_grad=True,
    )
    old = torch.tensor(
        [[0.0, -1.1, -0.4, -2.0], [0.0, -0.2, -0.7, 0.0], [0.0, -1.0, 0.0, 0.0], [0.0, -0.3, -0.2, -0.1]]
    )
    mask = torch.tensor([[0.0, 1, 1, 1], [0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 1]])
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * mask
    num_tokens, num_sequences = float(mask.sum()), 4.0
    for rows in torch.arange(4).split(micro_batch_size):
        per_token, _ = ppo_clip_loss(logprobs[rows], old[rows], advantages[rows], mask[rows], 0.2, 0.28, 3.0)
        per_token = per_token + 0.1 * kl_penalty(logprobs[rows], old[rows] - 0.5, "k3")
        aggregate(per_token, mask[rows], mode, num_tokens, num_sequences).backward()
    return logprobs.grad


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batching_does_not_change_the_gradient(mode):
    reference = _loss_gradient(4, mode)
    assert reference.abs().sum() > 0
    torch.testing.assert_close(_loss_gradient(1, mode), reference)
    torch.testing.assert_close(_loss_gradient(2, mode), reference)


# The first sequence of LOSS as an episode split into two samples: tokens 1, 2 | 3.
SPLIT_LOSS = torch.tensor([[1.0, 2.0, 0.0, 0.0], [3.0, 0.0, 0.0, 0.0], [4.0, 5.0, 0.0, 0.0]])
SPLIT_MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
SPLIT_EPISODES = torch.tensor([7, 7, 9])


def test_sequence_counts_count_an_episode_once_over_its_samples():
    row_episode_tokens, num_episodes = sequence_counts(SPLIT_MASK, SPLIT_EPISODES)
    assert row_episode_tokens.tolist() == [3.0, 3.0, 2.0] and num_episodes == 2.0
    # An episode whose samples carry no loss token is not counted.
    assert sequence_counts(SPLIT_MASK * torch.tensor([[1.0], [1.0], [0.0]]), SPLIT_EPISODES)[1] == 1.0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_an_episode_split_in_two_samples_has_the_loss_of_the_same_tokens_in_one_row(mode):
    whole = aggregate(LOSS, MASK, mode, 5, 2, loss_scale_factor=4)
    row_episode_tokens, num_episodes = sequence_counts(SPLIT_MASK, SPLIT_EPISODES)
    split = aggregate(SPLIT_LOSS, SPLIT_MASK, mode, 5, num_episodes, 4, row_episode_tokens)
    assert split.item() == pytest.approx(whole.item())
    # ... also when its samples land in different micro-batches.
    shares = sum(
        aggregate(SPLIT_LOSS[rows], SPLIT_MASK[rows], mode, 5, num_episodes, 4, row_episode_tokens[rows])
        for rows in ([0], [1, 2])
    )
    assert shares.item() == pytest.approx(whole.item())


def test_seq_mean_token_mean_weighs_an_episode_not_its_samples():
    # Counting rows would give (3/2 + 3/1 + 9/2) / 3 = 3.0; the episodes give (6/3 + 9/2) / 2 = 3.25.
    row_episode_tokens, num_episodes = sequence_counts(SPLIT_MASK, SPLIT_EPISODES)
    loss = aggregate(SPLIT_LOSS, SPLIT_MASK, "seq-mean-token-mean", 5, num_episodes, None, row_episode_tokens)
    assert loss.item() == pytest.approx(3.25)
