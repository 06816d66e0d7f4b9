"""pass@k: the unbiased estimator of the chance that at least one of k samples passes.

With n samples of which c pass, pass@k = 1 - C(n - c, k) / C(n, k), computed as a product
of ratios so that large n never overflows or loses precision.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k for one problem (n samples, c correct)."""
    if not 0 <= num_correct <= num_samples:
        raise ValueError(f"need 0 <= num_correct <= num_samples, got c={num_correct}, n={num_samples}")
    if not 1 <= k <= num_samples:
        raise ValueError(f"k must be between 1 and the number of samples ({num_samples}), got {k}")
    if num_samples - num_correct < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    probability_all_fail = 1.0
    for i in range(num_samples - num_correct + 1, num_samples + 1):
        probability_all_fail *= 1.0 - k / i
    return 1.0 - probability_all_fail


def mean_pass_at_k(counts: Iterable[tuple[int, int]], ks: Sequence[int]) -> dict[int, float]:
    """pass@k averaged over problems given (num_samples, num_correct) per problem.

    A k larger than some problem's sample count is left out of the result (it is undefined there).
    """
    counts = list(counts)
    if not counts:
        raise ValueError("no problems to score")
    return {
        k: sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
        for k in ks
        if all(n >= k for n, _ in counts)
    }


def parse_ks(text: str) -> list[int]:
    """'1,10,100' -> [1, 10, 100]."""
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--k must be comma-separated positive integers like 1,10, got {text!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"--k must be comma-separated positive integers like 1,10, got {text!r}")
    return ks
