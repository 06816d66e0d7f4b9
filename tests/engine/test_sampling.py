"""Per-row sampling on hand-written logits: filtering masks, inverse-CDF picks, logprobs."""

from __future__ import annotations

import math
import random

import pytest
import torch

from agentrl.engine.builtin.runner.sampling import (
    RowSampling,
    inverse_cdf_sample,
    sample_next_tokens,
    top_k_mask,
    top_p_mask,
    validate_sampling,
)
from agentrl.engine.protocol import SamplingParams

PROBS = [0.1, 0.2, 0.3, 0.4]


def rows(temperatures, uniforms, top_ks=None, top_ps=None) -> RowSampling:
    top_ks = top_ks or [-1] * len(temperatures)
    top_ps = top_ps or [1.0] * len(temperatures)
    return RowSampling(
        temperatures=torch.tensor(temperatures),
        top_ks=torch.tensor(top_ks),
        top_ps=torch.tensor(top_ps),
        uniforms=torch.tensor(uniforms, dtype=torch.float64),
        all_greedy=all(t == 0 for t in temperatures),
        max_top_k=max(top_ks),
        any_top_p=any(p < 1 for p in top_ps),
    )


def test_top_k_keeps_the_k_largest_logits_and_rows_without_top_k_keep_everything():
    scaled = torch.tensor([[1.0, 3.0, 2.0, 0.0], [1.0, 3.0, 2.0, 0.0]])
    mask = top_k_mask(scaled, torch.tensor([2, -1]), max_top_k=2)
    assert mask.tolist() == [[False, True, True, False], [True, True, True, True]]


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [
        (0.5, [False, True, False]),
        (0.7, [False, True, True]),
        (0.95, [True, True, True]),
        (1.0, [True, True, True]),
    ],
)
def test_top_p_keeps_the_smallest_most_likely_set_reaching_the_mass(top_p, expected):
    mask = top_p_mask(torch.tensor([[0.1, 0.6, 0.3]]), torch.tensor([top_p]))
    assert mask.tolist() == [expected]


@pytest.mark.parametrize(("uniform", "expected"), [(0.1, 0), (0.6, 1), (0.75, 2)])
def test_inverse_cdf_picks_the_token_whose_cumulative_weight_passes_the_draw(uniform, expected):
    token = inverse_cdf_sample(torch.tensor([[0.2, 0.5, 0.3]]), torch.tensor([uniform], dtype=torch.float64))
    assert token.tolist() == [expected]


def test_the_two_level_cdf_picks_what_one_full_scan_picks_across_block_edges():
    generator = torch.Generator().manual_seed(0)
    weights = torch.rand((64, 37), generator=generator) * (torch.rand((64, 37), generator=generator) > 0.3)
    uniforms = torch.rand(64, generator=generator, dtype=torch.float64)
    cdf = weights.double().cumsum(dim=-1)
    full_scan = torch.searchsorted(cdf, uniforms[:, None] * cdf[:, -1:], right=True).squeeze(-1)
    for block_size in (1, 4, 5, 37, 64):  # 37 tokens: padded to a whole number of blocks, or one block
        assert inverse_cdf_sample(weights, uniforms, block_size=block_size).tolist() == full_scan.tolist()


@pytest.mark.parametrize(("uniform", "expected"), [(0.0, 1), (0.5, 3), (0.999, 3)])
def test_inverse_cdf_never_picks_a_token_of_zero_weight(uniform, expected):
    weights = torch.tensor([[0.0, 0.5, 0.0, 0.5]])
    assert inverse_cdf_sample(weights, torch.tensor([uniform], dtype=torch.float64)).tolist() == [expected]


def test_greedy_rows_take_the_argmax_and_report_the_temperature_one_logprob():
    logits = torch.tensor([PROBS]).log()
    token_ids, logprobs = sample_next_tokens(logits, rows([0.0], [0.0]))
    assert token_ids.tolist() == [3]
    assert logprobs.item() == pytest.approx(math.log(0.4), abs=1e-6)


def test_sampled_rows_follow_their_own_uniform_draws():
    logits = torch.tensor([PROBS, PROBS, PROBS]).log()
    token_ids, logprobs = sample_next_tokens(logits, rows([1.0, 1.0, 0.0], [0.05, 0.95, 0.05]))
    assert token_ids.tolist() == [0, 3, 3]
    assert logprobs.tolist() == pytest.approx([math.log(0.1), math.log(0.4), math.log(0.4)], abs=1e-6)


def test_logprob_is_taken_before_top_k_filtering():
    logits = torch.tensor([PROBS]).log()
    # top-k 2 keeps tokens 2 and 3 (weights .3 and .4); a draw of 0.05 lands on token 2.
    token_ids, logprobs = sample_next_tokens(logits, rows([1.0], [0.05], top_ks=[2]))
    assert token_ids.tolist() == [2]
    assert logprobs.item() == pytest.approx(math.log(0.3), abs=1e-6)


def test_top_p_applies_to_the_distribution_left_by_top_k():
    logits = torch.tensor([PROBS]).log()
    # After top-k 2 the survivors have mass 3/7 and 4/7, so top-p 0.5 keeps token 3 alone.
    token_ids, _ = sample_next_tokens(logits, rows([1.0], [0.0], top_ks=[2], top_ps=[0.5]))
    assert token_ids.tolist() == [3]


def test_logprob_uses_the_temperature_scaled_distribution():
    logits = torch.tensor([PROBS]).log()
    # At temperature 0.5 the probabilities become p^2 / sum(p^2) = [.01, .04, .09, .16] / .30.
    token_ids, logprobs = sample_next_tokens(logits, rows([0.5], [0.99]))
    assert token_ids.tolist() == [3]
    assert logprobs.item() == pytest.approx(math.log(0.16 / 0.30), abs=1e-6)


def test_a_greedy_row_draws_nothing_from_its_generator():
    used, fresh = random.Random(7), random.Random(7)
    RowSampling.build([SamplingParams(max_new_tokens=1, temperature=0.0)], [used], torch.device("cpu"))
    assert used.random() == fresh.random()


def test_a_sampled_row_draws_its_uniform_from_its_own_seeded_generator():
    expected = random.Random(7).random()
    built = RowSampling.build(
        [SamplingParams(max_new_tokens=1), SamplingParams(max_new_tokens=1, temperature=0.0)],
        [random.Random(7), random.Random(8)],
        torch.device("cpu"),
    )
    assert built.uniforms.tolist() == [expected, 0.0]
    assert (built.all_greedy, built.max_top_k, built.any_top_p) == (False, -1, False)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (SamplingParams(max_new_tokens=0), "max_new_tokens=0"),
        (SamplingParams(max_new_tokens=4, temperature=-0.5), "temperature=-0.5"),
        (SamplingParams(max_new_tokens=4, top_p=0.0), "top_p=0.0"),
        (SamplingParams(max_new_tokens=4, top_p=1.5), "top_p=1.5"),
        (SamplingParams(max_new_tokens=4, top_k=0), "top_k=0"),
        (SamplingParams(max_new_tokens=4, top_k=-3), "top_k=-3"),
    ],
)
def test_out_of_range_sampling_params_are_rejected_by_name(params, message):
    with pytest.raises(ValueError, match=message):
        validate_sampling(params)
