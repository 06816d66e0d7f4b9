"""Inference stage, decode on CUDA graphs: one captured forward per (rows, key length) bucket.

A decode step of a small model is hundreds of short kernels; launched one by one from Python
they take longer than the GPU needs to run them. Replaying a captured graph launches them all at
once. Shapes must be fixed inside a graph, so the number of rows is rounded up to a power of two
(extra rows decode a dummy token into a free slot and are ignored) and the number of key
positions attention reads is rounded up to a multiple of `length_step`. Each bucket is captured
the first time it is needed, from the step's real inputs, which the capture's warm-up runs write
to the cache exactly as the replay will.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from agentrl.engine.host_copy import to_device

DecodeForward = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
"""(input_ids [rows, 1], positions [rows, 1], key_length) -> logits [rows, vocab]."""


def bucket_rows(num_rows: int, max_rows: int) -> int:
    """The smallest power of two >= num_rows, at most max_rows."""
    return min(max_rows, 1 << (num_rows - 1).bit_length())


class DecodeGraphs:
    """Captured decode forwards over static input buffers, keyed by (rows, key length)."""

    def __init__(
        self, forward: DecodeForward, *, max_rows: int, device: torch.device, length_step: int
    ) -> None:
        self._forward = forward
        self.max_rows = max_rows
        self.length_step = length_step
        self._inputs = torch.zeros((2, max_rows, 1), dtype=torch.long, device=device)  # ids, positions
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        """Forget every graph (the cache storage they read was reallocated), and their memory pool."""
        self._graphs.clear()
        self._pool = None  # a pool whose graphs are all freed cannot take a new capture

    def run(self, input_ids: torch.Tensor, positions: list[int], capacity: int) -> torch.Tensor:
        """Logits [len(positions), vocab] of one decode step; keys up to max(positions) are read.

        `input_ids` [rows] are on the device (the previous step's samples, mostly). Padding rows
        keep whatever ids the buffer holds from earlier steps: any valid id will do.
        """
        num_rows = len(positions)
        rows = bucket_rows(num_rows, self.max_rows)
        needed = max(positions) + 1
        key_length = min(capacity, -(-needed // self.length_step) * self.length_step)
        self._inputs[0, :num_rows, 0].copy_(input_ids)
        self._inputs[1, :rows, 0].copy_(
            to_device(positions + [0] * (rows - num_rows), torch.long, self._inputs.device)
        )
        key = (rows, key_length)
        if key not in self._graphs:
            self._graphs[key] = self._capture(rows, key_length)
        graph, logits = self._graphs[key]
        graph.replay()
        return logits[:num_rows]

    def _capture(self, rows: int, key_length: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        input_ids, positions = self._inputs[0, :rows], self._inputs[1, :rows]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the graph: lazy init, autotuning
            for _ in range(2):
                self._forward(input_ids, positions, key_length)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._forward(input_ids, positions, key_length)
        self._pool = graph.pool()
        return graph, logits
