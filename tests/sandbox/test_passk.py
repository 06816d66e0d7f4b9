"""The unbiased pass@k estimator."""

from math import comb

import pytest

from sandbox.passk import mean_pass_at_k, parse_ks, pass_at_k


def test_pass_at_1_is_the_fraction_correct() -> None:
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25, abs=1e-15)
    assert pass_at_k(3, 2, 1) == pytest.approx(2 / 3, abs=1e-15)


def test_pass_at_k_matches_the_binomial_formula() -> None:
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - comb(7, 5) / comb(10, 5), abs=1e-15)  # 11/12
    assert pass_at_k(10, 3, 5) == pytest.approx(11 / 12, abs=1e-15)


def test_edge_counts_give_zero_and_one() -> None:
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0  # fewer than k failures: some draw of k always passes
    assert pass_at_k(5, 5, 5) == 1.0


def test_large_sample_counts_do_not_overflow() -> None:
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5, abs=1e-12)


def test_impossible_counts_are_rejected_with_the_values() -> None:
    with pytest.raises(ValueError, match="c=6, n=5"):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError, match="got 6"):
        pass_at_k(5, 1, 6)


def test_mean_over_problems_leaves_out_undefined_ks() -> None:
    assert mean_pass_at_k([(3, 1), (3, 2)], [1, 2, 10]) == pytest.approx({1: 0.5, 2: 5 / 6}, abs=1e-15)


def test_parse_ks_reads_a_comma_list_and_names_bad_input() -> None:
    assert parse_ks("1,10,100") == [1, 10, 100]
    with pytest.raises(ValueError, match="'1,x'"):
        parse_ks("1,x")
    with pytest.raises(ValueError, match="'0'"):
        parse_ks("0")
