"""The env boundary lets only plain data through: numbers of any kind become Python ints and floats."""

import decimal
import fractions

import numpy as np
import pytest
import torch

from agentrl.env.validation import NotPlainData, check_step_return, plain_data


@pytest.mark.parametrize(("value", "plain"), [
    (np.float32(0.5), 0.5),
    (np.int64(3), 3),
    (np.bool_(False), False),
    (np.array(2.5), 2.5),
    (torch.tensor(7), 7),
    (decimal.Decimal("1.25"), 1.25),
    (fractions.Fraction(3, 4), 0.75),
    ((1, np.int8(2)), [1, 2]),
    ({"a": {np.int16(4): [np.float64(0.25)]}}, {"a": {"4": [0.25]}}),
    ("text", "text"),
    (None, None),
])  # fmt: skip
def test_numbers_of_any_kind_become_plain_python_numbers(value, plain):
    converted = plain_data(value)
    assert converted == plain
    assert type(converted) is type(plain)


@pytest.mark.parametrize(("value", "problem"), [
    (object(), "a builtins.object"),
    (np.arange(3), "a numpy.ndarray (convert it with .tolist())"),
    ({("a", "b"): 1}, "a dict key ('a', 'b') that is not a str"),
    (decimal.Decimal("sNaN"), "Decimal('sNaN') has no float value"),
    (1j, "a builtins.complex"),
])  # fmt: skip
def test_values_that_are_not_plain_data_are_named(value, problem):
    with pytest.raises(NotPlainData) as raised:
        plain_data(value)
    assert str(raised.value) == problem


def test_a_list_nested_in_itself_is_not_plain_data():
    looped: list = []
    looped.append(looped)
    with pytest.raises(NotPlainData, match="nested deeper than 32 levels"):
        plain_data(looped)


def test_a_message_field_that_is_not_plain_data_is_a_malformed_step_return():
    observation = [{"role": "tool", "content": "ok", "name": "search", "call": object()}]
    with pytest.raises(
        ValueError, match=r"^step's observation holds a builtins.object; a message's fields must be"
    ):
        check_step_return((observation, 0.0, False, False, {}))


def test_a_message_with_numpy_fields_comes_out_plain():
    observation = [{"role": "tool", "content": "ok", "index": np.int64(1)}]
    checked, reward, _, _, _ = check_step_return((observation, decimal.Decimal("0.5"), False, False, {}))
    assert checked == [{"role": "tool", "content": "ok", "index": 1}] and type(checked[0]["index"]) is int
    assert reward == 0.5 and type(reward) is float


@pytest.mark.parametrize("reward", [True, np.bool_(True), "1", None, float("inf"), decimal.Decimal("NaN")])
def test_a_reward_that_is_not_a_finite_number_is_malformed(reward):
    with pytest.raises(ValueError, match=r"^step's reward must be a finite number, got "):
        check_step_return(([], reward, True, False, {}))
