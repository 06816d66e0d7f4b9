"""Loss stage: per-token estimators of KL(policy || reference) from sampled-token log-probs.

With log-ratio x = logprob - ref_logprob on a token sampled from the policy (see
http://joschu.net/blog/kl-approx.html):

    k1 ("kl", "k1"):          x                       unbiased value, high variance
    abs ("abs"):              |x|
    k2 ("mse", "k2"):         x^2 / 2                 its gradient is the unbiased KL gradient
    k3 ("low_var_kl", "k3"):  exp(-x) - 1 + x         unbiased value, low variance, >= 0

A "+" suffix (e.g. "k3+", "low_var_kl+") is verl's straight-through form: the forward value
is the named estimator, the gradient is k2's. "k2+" and "mse+" equal "k2".
"""

from __future__ import annotations

import torch

from agentrl.algorithms.config import KL_KINDS, parse_kl_kind

__all__ = ["KL_KINDS", "kl_penalty", "parse_kl_kind"]

_LOG_RATIO_LIMIT = 20.0  # keeps exp() finite when the policies disagree wildly
_K3_LIMIT = 10.0  # a single token's k3 value beyond this is noise, not signal


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


def _forward_estimate(log_ratio: torch.Tensor, kind: str) -> torch.Tensor:
    if kind in ("kl", "k1"):
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind in ("mse", "k2"):
        return _k2(log_ratio)
    # k3: with y = ref - logprob, exp(y) - y - 1
    reverse = (-log_ratio).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    return (reverse.exp() - reverse - 1).clamp(-_K3_LIMIT, _K3_LIMIT)


def kl_penalty(
    logprobs: torch.Tensor,  # [...]
    ref_logprobs: torch.Tensor,  # [...]
    kind: str,
) -> torch.Tensor:  # [...]
    """Per-token KL estimate of `kind`; gradients flow through `logprobs` only."""
    base, straight_through = parse_kl_kind(kind)
    log_ratio = logprobs - ref_logprobs.detach()
    value = _forward_estimate(log_ratio, base)
    if not straight_through or base in ("mse", "k2"):
        return value
    gradient_carrier = _k2(log_ratio)
    return gradient_carrier - gradient_carrier.detach() + value.detach()
