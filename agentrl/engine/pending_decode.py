"""Inference stage, a decode step in flight: launched on the device, its tokens not yet read.

Reading a step's tokens on the host waits for the device, and the host's bookkeeping after it
(appending tokens, stop checks, retiring rows) leaves the device idle. With overlap the engine
launches step N+1 first, feeding it step N's sampled ids straight from the device, and reads step
N's tokens while the device runs step N+1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.engine.host_copy import to_device
from agentrl.engine.request import Request


@dataclass(frozen=True)
class PendingDecode:
    """A launched decode step; `read` waits for it and returns its tokens and logprobs."""

    requests: list[Request]  # the step's rows, in row order
    token_ids: torch.Tensor  # [rows] int64 on the device: the next step's input ids
    picked: torch.Tensor  # [2, rows] float64 (token id, logprob) on the host, complete once `ready` passed
    ready: torch.cuda.Event | None  # None on CPU, where `picked` is complete when launched

    @staticmethod
    def launch(requests: list[Request], token_ids: torch.Tensor, logprobs: torch.Tensor) -> PendingDecode:
        """Start copying the step's ids and logprobs to the host (one copy, not waited for on CUDA)."""
        picked = torch.stack([token_ids.double(), logprobs.double()])  # ids are exact in float64
        if not picked.is_cuda:
            return PendingDecode(requests, token_ids, picked, None)
        host = torch.empty(picked.shape, dtype=picked.dtype, pin_memory=True)
        host.copy_(picked, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return PendingDecode(requests, token_ids, host, ready)

    def read(self) -> tuple[list[float], list[float]]:
        """(token ids, logprobs) of each row, once the device has produced them."""
        if self.ready is not None:
            self.ready.synchronize()
        token_ids, logprobs = self.picked.tolist()
        return token_ids, logprobs

    def next_input_ids(self, requests: list[Request], device: torch.device) -> torch.Tensor:
        """[len(requests)] input ids of the step after this one, on `device`.

        A request in this step continues from the token this step sampled for it (still on the
        device); any other request (just prefilled) from its last token on the host.
        """
        rows = {request: row for row, request in enumerate(self.requests)}
        staged = [
            [rows.get(r, -1) for r in requests],
            [0 if r in rows else r.completion_ids[-1] for r in requests],
        ]
        sources, host_ids = to_device(staged, torch.long, device)
        return torch.where(sources >= 0, self.token_ids[sources.clamp(min=0)], host_ids)
