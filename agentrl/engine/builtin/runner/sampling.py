"""Inference stage, sampling step: turn one decode step's logits into tokens and logprobs.

Every row of a batch carries its own temperature, top-k, top-p and random stream, and the
token a row gets depends only on that row's logits and its own uniform draw. That is what
makes a seeded request sample the same tokens whether it runs alone or batched with others.
Sampling is inverse-CDF over the vocabulary in its natural order, so filtering only masks
tokens out and never reorders them. Each row draws from its own `random.Random`, seeded per
request, on the host: drawing 256 uniforms there costs microseconds. On CUDA, rows without
top-k or top-p (the usual RL case) take the same draw in two Triton kernels (`fused_sampling`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agentrl.engine.builtin.cache.host_copy import to_device
from agentrl.engine.protocol import SamplingParams

CDF_BLOCK = 1024  # tokens per block of the two-level cumulative sum


def validate_sampling(sampling: SamplingParams) -> None:
    """Raise ValueError naming the first field of `sampling` outside its valid range."""
    if sampling.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={sampling.max_new_tokens} must be >= 1")
    if sampling.temperature < 0:
        raise ValueError(f"temperature={sampling.temperature} must be >= 0 (0 means greedy)")
    if not 0 < sampling.top_p <= 1:
        raise ValueError(f"top_p={sampling.top_p} must be in (0, 1]; use 1.0 to disable top-p")
    if sampling.top_k == 0 or sampling.top_k < -1:
        raise ValueError(f"top_k={sampling.top_k} must be >= 1, or -1 to disable top-k")


@dataclass(frozen=True)
class RowSampling:
    """Per-row sampling parameters of one decode step, on the logits' device."""

    temperatures: torch.Tensor  # [num_rows] float32, 0 for greedy rows
    top_ks: torch.Tensor  # [num_rows] int64, -1 where top-k is off
    top_ps: torch.Tensor  # [num_rows] float32, 1 where top-p is off
    uniforms: torch.Tensor  # [num_rows] float64 in [0, 1), ignored on greedy rows
    all_greedy: bool  # known on the host, so no device sync is needed to skip sampling
    max_top_k: int  # largest top_k of any row, -1 when no row uses top-k
    any_top_p: bool

    @property
    def filters(self) -> bool:
        """Whether some row uses top-k or top-p (else the temperature-only sampler serves every row)."""
        return self.max_top_k > 0 or self.any_top_p

    @staticmethod
    def build(
        params: list[SamplingParams], generators: list[random.Random], device: torch.device
    ) -> RowSampling:
        """Draw one uniform per sampled row from that row's own generator; one host-to-device copy."""
        staged = to_device(sampling_rows(params, draw_uniforms(params, generators)), torch.float64, device)
        return RowSampling.from_staged(staged, params)

    @staticmethod
    def from_staged(staged: torch.Tensor, params: list[SamplingParams]) -> RowSampling:
        """From `sampling_rows` on the device ([4, rows] float64); the flags come from `params` on the host."""
        return RowSampling.of(staged[0].float(), staged[1].long(), staged[2].float(), staged[3], params)

    @staticmethod
    def of(
        temperatures: torch.Tensor,
        top_ks: torch.Tensor,
        top_ps: torch.Tensor,
        uniforms: torch.Tensor,
        params: list[SamplingParams],
    ) -> RowSampling:
        """The rows' tensors as given; the host-side flags from `params`."""
        return RowSampling(
            temperatures=temperatures,
            top_ks=top_ks,
            top_ps=top_ps,
            uniforms=uniforms,
            all_greedy=all(p.temperature == 0 for p in params),
            max_top_k=max((p.top_k for p in params), default=-1),
            any_top_p=any(p.top_p < 1 for p in params),
        )


def uses_filters(params: list[SamplingParams]) -> bool:
    """Whether some row uses top-k or top-p (else the temperature-only sampler serves every row)."""
    return any(p.top_k > 0 or p.top_p < 1 for p in params)


def draw_uniforms(params: list[SamplingParams], generators: list[random.Random]) -> list[float]:
    """This step's draw for each row from its own generator; greedy rows draw nothing."""
    return [g.random() if p.temperature > 0 else 0.0 for p, g in zip(params, generators, strict=True)]


def sampling_rows(params: list[SamplingParams], uniforms: list[float]) -> list[list[float]]:
    """[temperatures, top-k, top-p, uniforms], one value per row: 4 rows of a float64 block (top-k is exact)."""
    return [[p.temperature for p in params], [p.top_k for p in params], [p.top_p for p in params], uniforms]


def sample_picked(
    logits: torch.Tensor,
    rows: RowSampling,
    token_ids: torch.Tensor,
    pick_buffer: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | None:
    """Sample one token per row into `token_ids` [num_rows] int64; return their picks (`stack_picked`).

    On CUDA, rows without top-k or top-p take the Triton sampler (`fused_sampling`), which writes
    both outputs itself, the picks into `pick_buffer` when given (then None is returned); every
    other case samples with `sample_next_tokens`.
    """
    if logits.is_cuda and not rows.filters:
        from agentrl.engine.builtin.kernels.fused_sampling import (
            sample_with_temperature,  # Triton: CUDA machines only
        )

        return sample_with_temperature(logits, rows.temperatures, rows.uniforms, token_ids, pick_buffer)[1]
    sampled, logprobs = sample_next_tokens(logits, rows)
    token_ids.copy_(sampled)
    return stack_picked(sampled, logprobs)


def sample_next_tokens(logits: torch.Tensor, rows: RowSampling) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row with torch operations; return (token_ids [num_rows], logprobs [num_rows]).

    The logprob is log_softmax(logits / temperature) of the chosen token before top-k/top-p
    filtering; greedy rows (temperature 0) report log_softmax(logits).
    """
    greedy = rows.temperatures == 0
    scale = torch.where(greedy, torch.ones_like(rows.temperatures), rows.temperatures)
    scaled = logits.float() / scale[:, None]  # [num_rows, vocab]
    log_normalizers = torch.logsumexp(scaled, dim=-1, keepdim=True)  # [num_rows, 1]
    token_ids = scaled.argmax(dim=-1)
    if not rows.all_greedy:
        weights = (scaled - log_normalizers).exp()
        if rows.filters:
            weights = weights.masked_fill_(~top_k_top_p_mask(scaled, rows), 0.0)
        sampled = inverse_cdf_sample(weights, rows.uniforms)
        token_ids = torch.where(greedy, token_ids, sampled)
    logprobs = scaled.gather(-1, token_ids[:, None]) - log_normalizers
    return token_ids, logprobs.squeeze(-1)


def stack_picked(token_ids: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """[2, rows] float64 (token id, logprob): one tensor, so one copy brings a step's picks to the host."""
    return torch.stack((token_ids.double(), logprobs.double()))  # ids are exact in float64


def top_k_top_p_mask(scaled: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """Top-k first, then top-p over the renormalised survivors (the usual warper order)."""
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if rows.max_top_k > 0:
        keep = top_k_mask(scaled, rows.top_ks, rows.max_top_k)
    if rows.any_top_p:
        probs = torch.softmax(scaled.masked_fill(~keep, -torch.inf), dim=-1)
        keep = keep & top_p_mask(probs, rows.top_ps)
    return keep


def top_k_mask(scaled: torch.Tensor, top_ks: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """Keep, per row, the tokens whose logit is at least the row's k-th largest (ties are kept)."""
    num_largest = min(max_top_k, scaled.shape[-1])
    largest = torch.topk(scaled, num_largest, dim=-1).values  # [num_rows, num_largest]
    kth = (top_ks.clamp(min=1, max=num_largest) - 1)[:, None]
    thresholds = torch.where(top_ks[:, None] > 0, largest.gather(-1, kth), -torch.inf)
    return scaled >= thresholds


def top_p_mask(probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Keep, per row, the smallest set of most likely tokens whose mass reaches top_p."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep_sorted = mass_before < top_ps[:, None]
    keep_sorted[:, 0] = True  # the most likely token always survives
    keep = torch.empty_like(keep_sorted).scatter_(-1, order, keep_sorted)
    # Rows with top-p off keep everything: rounding in the cumulative sum must not drop their tail.
    return keep | (top_ps >= 1)[:, None]


def inverse_cdf_sample(
    weights: torch.Tensor, uniforms: torch.Tensor, block_size: int = CDF_BLOCK
) -> torch.Tensor:
    """Pick, per row, the token where the cumulative weight first exceeds uniform * total.

    `weights` [num_rows, vocab] are non-negative and need not sum to one. The cumulative sum
    is taken in float64 and in two levels: over blocks of `block_size` tokens, then within the
    one block the draw lands in, so the full-vocabulary float64 scan is never materialised.
    """
    num_rows, vocab = weights.shape
    num_blocks = -(-vocab // block_size)
    if num_blocks * block_size != vocab:
        weights = F.pad(weights, (0, num_blocks * block_size - vocab))
    blocks = weights.view(num_rows, num_blocks, block_size)
    block_sums = blocks.sum(dim=-1, dtype=torch.float64)  # [num_rows, num_blocks]
    block_cdf = block_sums.cumsum(dim=-1)
    targets = uniforms[:, None] * block_cdf[:, -1:]
    block = torch.searchsorted(block_cdf, targets, right=True).clamp_(max=num_blocks - 1)  # [num_rows, 1]
    before = block_cdf.gather(-1, block) - block_sums.gather(-1, block)
    chosen = blocks.gather(1, block[:, :, None].expand(num_rows, 1, block_size)).squeeze(1)
    inner_cdf = before + chosen.double().cumsum(dim=-1)  # [num_rows, block_size]
    offset = torch.searchsorted(inner_cdf, targets, right=True).clamp_(max=block_size - 1)
    token_ids = (block * block_size + offset).squeeze(-1)
    # Rounding can land a draw of u ~ 1 past the last kept token; fall back to the likeliest one.
    landed = weights.gather(-1, token_ids[:, None]).squeeze(-1) > 0
    return torch.where(landed, token_ids, weights.argmax(dim=-1))
