"""Inference stage, small prefill passes on CUDA graphs: one captured pass per (tokens, rows) bucket.

A prefill pass launches a few hundred kernels; launched one by one from Python they take the
host about as long as a pass of a couple of thousand tokens takes the GPU. With the prefix cache
on, most passes feed only what the cache lacks (a new turn's observation, a group member's
suffix), so without graphs the GPU would wait on the host for most of each pass. Passes of up to
`MAX_GRAPH_TOKENS` tokens replay a captured graph instead; larger ones keep the GPU busy without.

Shapes are fixed inside a graph, so a pass is padded (`PackedPrefill.pad`) to a power-of-two
number of tokens (at least `TILE_TOKENS`), to as many rows as it has tokens (at most the
engine's rows: the head over a few extra rows costs less than a graph per row count would), and
to as many attention tiles as such a pass can need. Its inputs travel in one int64 vector copied
once from pinned memory. Every bucket is captured as soon as the storage is (re)allocated, on a
pass of padding alone, which stores nothing and attends to nothing: no pass waits for a capture.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from agentrl.engine.builtin.runner.packed_prefill import TILE_TOKENS, PackedPrefill

MAX_GRAPH_TOKENS = 2048  # larger passes run eagerly: the GPU, not the host, sets their time

PrefillStep = Callable[[PackedPrefill], torch.Tensor]
"""(packed pass on the device) -> logits [rows, vocab] of each row's last token."""


def power_of_two_at_least(value: int, floor: int = 1) -> int:
    return max(floor, 1 << (value - 1).bit_length())


class PrefillGraphs:
    """Captured prefill passes over one static input vector, one per bucket of tokens."""

    def __init__(self, step: PrefillStep, *, max_rows: int, device: torch.device) -> None:
        self._step = step
        self.max_rows = max_rows
        self._flat = torch.zeros(self._flat_size(MAX_GRAPH_TOKENS), dtype=torch.int64, device=device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None

    def _shape(self, num_tokens: int) -> tuple[int, int]:
        """(tiles, rows) of the bucket of `num_tokens` tokens: a row adds at most one partial tile."""
        num_rows = min(num_tokens, self.max_rows)
        return num_tokens // TILE_TOKENS + num_rows, num_rows

    def _flat_size(self, num_tokens: int) -> int:
        num_tiles, num_rows = self._shape(num_tokens)
        return 3 * num_tokens + 4 * num_tiles + num_rows

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        """Forget every graph (the cache storage they read was reallocated), and their memory pool."""
        self._graphs.clear()
        self._pool = None

    @staticmethod
    def serves(packed: PackedPrefill) -> bool:
        """Whether a pass is small enough to replay as a graph."""
        return packed.num_tokens <= MAX_GRAPH_TOKENS

    def run(self, packed: PackedPrefill) -> torch.Tensor:
        """Logits [rows, vocab] of the pass (`packed` on the host), replayed from its bucket's graph."""
        if not self._graphs:
            self.capture_all()
        num_tokens = power_of_two_at_least(packed.num_tokens, floor=TILE_TOKENS)
        graph, logits = self._graphs[num_tokens]
        self._stage(packed, num_tokens)
        graph.replay()
        return logits[: packed.num_rows]

    def _stage(self, packed: PackedPrefill, num_tokens: int) -> PackedPrefill:
        """Copy `packed`, padded to the bucket, into the static inputs; returns them as the graph reads them."""
        num_tiles, num_rows = self._shape(num_tokens)
        inputs = self._flat[: self._flat_size(num_tokens)]
        inputs.copy_(packed.pad(num_tokens, num_tiles, num_rows).flat().pin_memory(), non_blocking=True)
        return PackedPrefill.view(inputs, num_tokens, num_tiles)

    def capture_all(self) -> None:
        """One graph per bucket, each captured on a pass of padding alone (safe while rows run)."""
        nothing = PackedPrefill(
            torch.zeros((3, 0), dtype=torch.int64),
            torch.zeros((0, 4), dtype=torch.int64),
            torch.zeros(0, dtype=torch.int64),
        )
        num_tokens = TILE_TOKENS
        while num_tokens <= MAX_GRAPH_TOKENS:
            self._graphs[num_tokens] = self._capture(self._stage(nothing, num_tokens))
            num_tokens *= 2

    def _capture(self, inputs: PackedPrefill) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the graph: lazy init, autotuning
            for _ in range(2):
                self._step(inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._step(inputs)
        self._pool = graph.pool()
        return graph, logits
