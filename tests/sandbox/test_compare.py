"""Output comparison on the host: stdout lines and JSON return values."""

import math

from sandbox.compare import Comparison, compare_stdout, compare_values, normalise_lines, numbers_close


def test_trailing_whitespace_and_trailing_blank_lines_are_ignored() -> None:
    assert normalise_lines("1 2  \n3\t\r\n\n\n") == ["1 2", "3"]
    assert compare_stdout("1 2  \n3\r\n\n", "1 2\n3") == Comparison(True)


def test_leading_whitespace_and_inner_blank_lines_still_matter() -> None:
    assert compare_stdout(" 1\n", "1\n") == Comparison(False, "line 1: expected '1', got ' 1'")
    assert compare_stdout("1\n\n2\n", "1\n2\n") == Comparison(False, "line 2: expected '2', got ''")


def test_a_prefix_of_the_expected_output_is_not_a_match() -> None:
    assert compare_stdout("1\n2\n", "1\n2\n3\n") == Comparison(False, "expected 3 lines, got 2")
    assert compare_stdout("", "0\n") == Comparison(False, "expected 1 lines, got 0")


def test_extra_output_lines_are_not_a_match() -> None:
    assert compare_stdout("1\n2\n", "1\n") == Comparison(False, "expected 1 lines, got 2")


def test_float_tolerance_is_absolute_or_relative_per_token() -> None:
    assert compare_stdout("0.3333 1000001\n", "0.33333333 1000000\n", float_tolerance=1e-3).ok
    assert not compare_stdout("0.32 1\n", "0.33 1\n", float_tolerance=1e-3).ok
    assert not compare_stdout("0.3333\n", "0.33333333\n").ok  # no tolerance: text must match
    assert not compare_stdout("1 2\n", "1 2 3\n", float_tolerance=0.5).ok
    assert not compare_stdout("yes\n", "no\n", float_tolerance=0.5).ok


def test_numbers_close_treats_nan_as_equal_only_to_nan() -> None:
    assert numbers_close(math.nan, math.nan, 0.1)
    assert not numbers_close(math.nan, 1.0, 0.1)
    assert numbers_close(100.0, 100.5, 0.01)  # relative
    assert not numbers_close(0.0, 0.02, 0.01)


def test_values_compare_structurally_with_paths_in_messages() -> None:
    assert compare_values([1, {"a": "x"}], [1, {"a": "x"}]) == Comparison(True)
    assert compare_values([1, {"a": "y"}], [1, {"a": "x"}]) == Comparison(
        False, "$[1].a: expected 'x', got 'y'"
    )
    assert compare_values([1], [1, 2]) == Comparison(False, "$: expected 2 items, got 1")
    assert compare_values({"b": 1}, {"a": 1}) == Comparison(False, "$: expected keys ['a'], got ['b']")


def test_bools_are_not_numbers_but_ints_and_floats_compare_by_value() -> None:
    assert not compare_values(True, 1).ok
    assert not compare_values(1, True).ok
    assert compare_values(2.0, 2).ok
    assert not compare_values("1", 1).ok
    assert not compare_values(None, 0).ok
    assert compare_values(None, None).ok


def test_value_tolerance_applies_to_nested_floats() -> None:
    assert compare_values([0.1 + 0.2], [0.3], float_tolerance=1e-9).ok
    assert not compare_values([0.1 + 0.2], [0.3]).ok


def test_numeric_tokens_under_a_tolerance_are_ascii_numbers_only() -> None:
    verdicts = [
        compare_stdout(printed, "10\n", float_tolerance=1e-6).ok
        for printed in ["١٠", "1_0", "１٠", "10.0000001"]
    ]
    assert verdicts == [False, False, False, True]


def test_integers_beyond_a_floats_exact_range_compare_exactly_under_a_tolerance() -> None:
    big = "1" * 400
    assert [compare_stdout(printed, big, float_tolerance=1e-3).ok for printed in [big, "1" * 399 + "2"]] == [
        True,
        False,
    ]
    assert (
        compare_values(10**400 + 1, 10**400, float_tolerance=1e-3).message
        == f"$: expected {str(10**400)[:77]}..., got {str(10**400 + 1)[:77]}..."
    )
