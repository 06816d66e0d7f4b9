import math

import pytest
import torch
from torch.testing import assert_close

from agentrl.algorithms import kl_penalty

# log-ratio x = logprob - ref_logprob is +1 for the first token and -0.5 for the second.
LOGPROBS = [-1.0, -2.0]
REF_LOGPROBS = [-2.0, -1.5]


def value_and_gradient(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    logprobs = torch.tensor(LOGPROBS, requires_grad=True)
    value = kl_penalty(logprobs, torch.tensor(REF_LOGPROBS), kind)
    value.sum().backward()
    return value.detach(), logprobs.grad


@pytest.mark.parametrize(
    ("kind", "expected_value", "expected_gradient"),
    [
        ("k1", [1.0, -0.5], [1.0, 1.0]),
        ("kl", [1.0, -0.5], [1.0, 1.0]),
        ("abs", [1.0, 0.5], [1.0, -1.0]),
        ("k2", [0.5, 0.125], [1.0, -0.5]),
        ("mse", [0.5, 0.125], [1.0, -0.5]),
        # k3 = exp(-x) - 1 + x, gradient 1 - exp(-x)
        ("k3", [math.exp(-1.0), math.exp(0.5) - 1.5], [1 - math.exp(-1.0), 1 - math.exp(0.5)]),
        ("low_var_kl", [math.exp(-1.0), math.exp(0.5) - 1.5], [1 - math.exp(-1.0), 1 - math.exp(0.5)]),
    ],
)
def test_each_estimator_has_its_value_and_gradient(kind, expected_value, expected_gradient):
    value, gradient = value_and_gradient(kind)
    assert_close(value, torch.tensor(expected_value))
    assert_close(gradient, torch.tensor(expected_gradient))


@pytest.mark.parametrize(
    ("kind", "expected_value"),
    [
        ("k1+", [1.0, -0.5]),
        ("abs+", [1.0, 0.5]),
        ("k3+", [math.exp(-1.0), math.exp(0.5) - 1.5]),
        ("low_var_kl+", [math.exp(-1.0), math.exp(0.5) - 1.5]),
        ("k2+", [0.5, 0.125]),
    ],
)
def test_plus_forms_keep_the_named_value_and_take_the_k2_gradient(kind, expected_value):
    value, gradient = value_and_gradient(kind)
    assert_close(value, torch.tensor(expected_value))
    assert_close(gradient, torch.tensor([1.0, -0.5]))  # d/dx x^2/2 = x


def test_no_gradient_reaches_the_reference_logprobs():
    reference = torch.tensor(REF_LOGPROBS, requires_grad=True)
    kl_penalty(torch.tensor(LOGPROBS, requires_grad=True), reference, "k3").sum().backward()
    assert reference.grad is None


def test_an_unknown_estimator_is_rejected_with_the_valid_names():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")
