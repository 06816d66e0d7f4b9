"""Inference stage, a decode step in flight: launched on the device, its tokens not yet read.

Reading a step's tokens on the host waits for the device, and the host's bookkeeping after it
(appending tokens, stop checks, retiring rows) leaves the device idle. With overlap the engine
launches step N+1 first, feeding it step N's samples straight from the device (`rows_of` says
which row of step N each row of step N+1 continues), and reads step N's tokens while the device
runs step N+1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.engine.request import Request


@dataclass(frozen=True)
class PendingDecode:
    """A launched decode step; `read` waits for it and returns its tokens and logprobs."""

    requests: list[Request]  # the step's rows, in row order
    picked: torch.Tensor  # [2, rows] float64 (token id, logprob) on the host, complete once `ready` passed
    ready: torch.cuda.Event | None  # None on CPU, where `picked` is complete when launched

    @staticmethod
    def launch(requests: list[Request], picked: torch.Tensor) -> PendingDecode:
        """Start copying `picked` ([2, rows] float64, `sampling.stack_picked`) to the host, not waited for on CUDA."""
        if not picked.is_cuda:
            return PendingDecode(requests, picked, None)
        host = torch.empty(picked.shape, dtype=picked.dtype, pin_memory=True)
        host.copy_(picked, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return PendingDecode(requests, host, ready)

    def read(self) -> tuple[list[float], list[float]]:
        """(token ids, logprobs) of each row, once the device has produced them."""
        if self.ready is not None:
            self.ready.synchronize()
        token_ids, logprobs = self.picked.tolist()
        return token_ids, logprobs

    def rows_of(self, requests: list[Request]) -> list[int]:
        """Each request's row in this step, or -1 for one this step did not decode (just prefilled)."""
        rows = {request: row for row, request in enumerate(self.requests)}
        return [rows.get(request, -1) for request in requests]
