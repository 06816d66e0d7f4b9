"""Inference stage, a pass in flight: launched on the device, its sampled tokens not yet read.

Reading a pass's tokens on the host waits for the device, and the host's bookkeeping after it
(appending tokens, stop checks, retiring rows) leaves the device idle. So the engine reads late:
it launches decode step N+1 before reading step N's tokens, feeding each row of N+1 its
previous token straight from the device, and a prefill pass's first tokens are read only after
the decode step that continues them is launched, so the host prepares the next pass while the
device still computes this one. Each pass leaves its samples in the runner's sample buffer;
`sample_sources` says where each row finds its latest one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentrl.engine.builtin.scheduler.request import Request


@dataclass(frozen=True)
class PendingStep:
    """A launched pass (a decode step or a prefill pass); `read` waits for it and returns its tokens."""

    requests: list[Request]  # the pass's rows, in row order
    picked: torch.Tensor  # [2, rows] float64 (token id, logprob) on the host, complete once `ready` passed
    ready: torch.cuda.Event | None  # None on CPU, where `picked` is complete when launched
    first_sample: int  # row i's sample is entry first_sample + i of the runner's sample buffer
    decode: bool  # a decode step (else a prefill pass)

    @staticmethod
    def launch(
        requests: list[Request], picked: torch.Tensor, first_sample: int, decode: bool, device: torch.device
    ) -> PendingStep:
        """Start copying `picked` ([2, rows] float64, `sampling.stack_picked`) to the host, not waited for on CUDA.

        On a CUDA `device`, a `picked` already on the host is pinned memory the pass writes itself
        (the runner's pick buffer): it is read once the pass is done.
        """
        if device.type != "cuda":
            return PendingStep(requests, picked, None, first_sample, decode)
        if picked.is_cuda:
            host = torch.empty(picked.shape, dtype=picked.dtype, pin_memory=True)
            host.copy_(picked, non_blocking=True)
            picked = host
        ready = torch.cuda.Event()
        ready.record()
        return PendingStep(requests, picked, ready, first_sample, decode)

    def wait(self) -> None:
        """Return once the device has run the pass."""
        if self.ready is not None:
            self.ready.synchronize()

    def read(self) -> tuple[list[float], list[float]]:
        """(token ids, logprobs) of each row, once the device has produced them."""
        self.wait()
        token_ids, logprobs = self.picked.tolist()
        return token_ids, logprobs


def sample_sources(requests: list[Request], pending: Sequence[PendingStep]) -> list[int]:
    """Where each request's latest sample is in the runner's sample buffer, or -1 where the host has it.

    `pending` in launch order: a request's latest pass is the last one holding it.
    """
    sources = {}
    for step in pending:
        sources.update({request: step.first_sample + row for row, request in enumerate(step.requests)})
    return [sources.get(request, -1) for request in requests]
