"""Inference stage, decode on CUDA graphs: one captured step per (rows, key length) bucket, with and without shared prefixes.

A decode step of a small model is hundreds of short kernels; launched one by one from Python
they take longer than the GPU needs to run them. Replaying a captured graph launches them all at
once, sampling included. Shapes must be fixed inside a graph, so the number of rows is rounded up
(`bucket_rows`: padding columns of the staged block decode a dummy token into a free slot and are
ignored) and the number of key positions attention reads is rounded up to a multiple of
`length_step`, or is the whole storage where the step's attention reads each row's own keys
whatever it is given (the fused forward's): then one graph per row bucket serves every length,
and the first step at a storage size captures every row bucket at once, so a run never stops to
capture in the middle. Captures run on the step's real inputs, cut or padded to the bucket's
width: their warm-up runs write each real row's key/value where the step itself will write it
(the step then runs and writes it again) and padding columns only into free slots.

A step where some row reads its first keys from another row's slot (`prefix_sharing`) runs
attention that looks that up; a step where none does, the plain kernel, which measured a little
faster. Each is captured when a step first needs it.

A graph reads its staged block where the host writes it, in pinned host memory, so that no copy
sits between two steps. Steps take `num_blocks` blocks in turn, each with its own graphs, one
more than the decode steps the scheduler launches before reading one (`decode_lookahead`): the
host writes step N+num_blocks's block only after it has read step N's tokens (`pending_step`),
so after step N has run, and a step in flight never has its block rewritten.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from agentrl.engine.builtin.runner.decode_batch import DecodeBatch
from agentrl.engine.builtin.runner.decode_fields import NUM_FIELDS

ROW_STEP = 32  # past this many rows, graphs come in multiples of it

DecodeStep = Callable[[torch.Tensor, int, bool], tuple[torch.Tensor, torch.Tensor | None]]
"""(staged block [NUM_FIELDS, columns] in pinned host memory, key_length, whether rows share prefixes) ->
(logits [columns, vocab], picked [2, columns], or None where the step wrote its picks into the pick buffer)."""


def bucket_rows(num_rows: int, max_rows: int) -> int:
    """Rows of the graph that decodes `num_rows` rows, at most `max_rows`.

    The next power of two up to `ROW_STEP`, then the next multiple of `ROW_STEP`: padding rows cost
    GEMM time, so a large batch is padded by less than a power of two would pad it.
    """
    if num_rows <= ROW_STEP:
        return min(max_rows, 1 << (num_rows - 1).bit_length())
    return min(max_rows, -(-num_rows // ROW_STEP) * ROW_STEP)


def row_buckets(max_rows: int) -> list[int]:
    """Every graph width `bucket_rows` gives for 1..max_rows rows, ascending."""
    return sorted({bucket_rows(num_rows, max_rows) for num_rows in range(1, max_rows + 1)})


class DecodeGraphs:
    """Captured decode steps over `num_blocks` static input blocks in pinned host memory, keyed by
    (block, rows, key length, shared prefixes).

    `length_step`: key lengths are rounded up to a multiple of it, and each (rows, key length)
    is captured when first needed; None: every step reads the storage's whole capacity (for a
    step whose cost follows each row's own length), and every row bucket is captured at once.
    `carried`: a device tensor the step reads and then overwrites (the previous step's samples);
    the capture's warm-up runs put it back as they found it, so the replay reads what it should.
    `capture_pick_entry`: the pick buffer entry (`decode_batch`) the warm-up runs write, which no
    step in flight reads.
    """

    def __init__(
        self,
        step: DecodeStep,
        *,
        max_rows: int,
        device: torch.device,
        length_step: int | None,
        carried: torch.Tensor,
        capture_pick_entry: int,
        num_blocks: int,
    ) -> None:
        self._step = step
        self._capture_pick_entry = capture_pick_entry  # where captures' warm-up steps write their picks
        self.max_rows = max_rows
        self.length_step = length_step
        self._carried = carried
        self.device = device
        self.num_blocks = num_blocks
        self._blocks = torch.zeros((num_blocks, NUM_FIELDS * max_rows), dtype=torch.float64, pin_memory=True)
        self._next_block = 0
        # By (block, columns, key length, shared prefixes).
        self._graphs: dict[
            tuple[int, int, int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor | None]
        ] = {}
        self._pool = None

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        """Forget every graph (the cache storage they read was reallocated), and their memory pool."""
        self._graphs.clear()
        self._pool = None  # a pool whose graphs are all freed cannot take a new capture

    def columns(self, num_rows: int) -> int:
        """Columns of the staged block for `num_rows` rows: the graph bucket's."""
        return bucket_rows(num_rows, self.max_rows)

    def run(self, batch: DecodeBatch, capacity: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits, picked) of one decode step, every column; keys up to the longest row are read."""
        columns = batch.staged.shape[1]
        key_length = capacity
        if self.length_step is not None:
            needed = batch.max_position + 1
            key_length = min(capacity, -(-needed // self.length_step) * self.length_step)
        index = self._next_block
        self._next_block = (index + 1) % self.num_blocks
        shares = batch.shares
        if (index, columns, key_length, shares) not in self._graphs:
            widths = [columns] if self.length_step is not None else row_buckets(self.max_rows)
            for block_index, width in itertools.product(range(self.num_blocks), widths):
                if (block_index, width, key_length, shares) not in self._graphs:
                    # The block is rewritten: the steps in flight and the last capture's warm-up runs read it.
                    torch.cuda.synchronize(self.device)
                    block = self._block_of(block_index, width)
                    block.copy_(batch.widened(width, self._capture_pick_entry))
                    graph = self._capture(block, key_length, shares)
                    self._graphs[(block_index, width, key_length, shares)] = graph
        self._block_of(index, columns).copy_(batch.staged)
        graph, logits, picked = self._graphs[(index, columns, key_length, shares)]
        graph.replay()
        return logits, picked

    def _block_of(self, index: int, columns: int) -> torch.Tensor:
        """Static input block `index` as the graphs of `columns` columns read it."""
        return self._blocks[index, : NUM_FIELDS * columns].view(NUM_FIELDS, columns)

    def _capture(
        self, block: torch.Tensor, key_length: int, shares: bool
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor | None]:
        carried = self._carried.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the graph: lazy init, autotuning
            for _ in range(2):
                self._step(block, key_length, shares)
                self._carried.copy_(carried)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits, picked = self._step(block, key_length, shares)
        self._pool = graph.pool()
        return graph, logits, picked
