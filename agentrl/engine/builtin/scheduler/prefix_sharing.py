"""Inference stage, shared prefixes at decode: rows whose slots start with the same keys and values read them from one slot.

The members of a group share their prompt, and every later turn of their episodes starts with
it: the prefix cache copies its keys and values into each member's slot, and a decode step
would read them from every slot, as many times as the group has members. Instead, decode
attention reads a row's first positions from the slot of another row that holds the very same
keys and values there (`decode_attention`): after the first row, those reads come from L2, and
since the data are the same bits, every row's output is bit for bit what its own slot gives.

The same bits: the prefix cache names each block by a node id it never reuses. A slot holds
a block's keys and values bit for bit when the cache copied the block into it, or copied the
block from it; a block the row computed itself while another row's copy went into the cache
may differ in rounding. `slot_nodes` lists the blocks a slot holds so from position 0, and
`SharedPrefixes` tracks them for the running rows.
"""

from __future__ import annotations

from agentrl.engine.builtin.cache.prefix_cache import CachedPath
from agentrl.engine.builtin.scheduler.request import Request


def slot_nodes(copied: list[int], path: CachedPath) -> list[int]:
    """Node ids of the cached blocks that a slot holds bit for bit, from position 0, after its prefill pass.

    `copied`: the blocks the cache copied into the slot before the pass that the pass did not
    write again; `path`: its prompt's cached blocks after the pass's insert. The blocks the insert
    found cached must be the copied ones, in order; the first that is not ends the list.
    """
    num_found = len(path.node_ids) - path.num_added
    same = 0
    while same < min(len(copied), num_found) and copied[same] == path.node_ids[same]:
        same += 1
    return path.node_ids if same == num_found else path.node_ids[:same]


class SharedPrefixes:
    """The running rows' blocks (`slot_nodes`), and which row each reads its shared start from.

    A row reads its deepest block that another row also holds, and every block before it, from
    the first row that took that block: one slot for a whole group.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._holders: dict[int, list[Request]] = {}  # node id -> running rows holding it, in join order
        self._nodes: dict[Request, list[int]] = {}
        self._deepest: dict[Request, int] = {}  # index into its nodes of the deepest one shared; -1: none
        self._sources: tuple[list[Request], list[int], list[int]] | None = None  # the last rows asked about

    def join(self, request: Request, nodes: list[int]) -> None:
        """A row enters the batch holding `nodes` (`slot_nodes`)."""
        self._nodes[request] = nodes
        deepest = -1
        for depth, node in enumerate(nodes):
            holders = self._holders.setdefault(node, [])
            if len(holders) == 1:
                self._deepest[holders[0]] = max(self._deepest[holders[0]], depth)
            if holders:
                deepest = depth
            holders.append(request)
        self._deepest[request] = deepest
        self._sources = None

    def leave(self, request: Request) -> None:
        """A row that joined leaves the batch."""
        nodes = self._nodes.pop(request)
        del self._deepest[request]
        alone = set()
        for node in nodes:
            holders = self._holders[node]
            holders.remove(request)
            if len(holders) == 1:
                alone.add(holders[0])
            elif not holders:
                del self._holders[node]
        for holder in alone:
            self._deepest[holder] = max(
                (depth for depth, node in enumerate(self._nodes[holder]) if len(self._holders[node]) > 1),
                default=-1,
            )
        self._sources = None

    def clear(self) -> None:
        """Every row left (the batch failed)."""
        self._holders.clear()
        self._nodes.clear()
        self._deepest.clear()
        self._sources = None

    def sources(self, rows: list[Request]) -> tuple[list[int], list[int]]:
        """(share_rows, share_lengths) [rows]: row i may read positions [0, share_lengths[i]) from
        the slot of row share_rows[i]; itself, and 0, where it reads only its own.

        `rows`: the batch's rows in slot order. Recomputed only when they changed since the last call.
        """
        if self._sources is None or self._sources[0] != rows:
            share_rows, share_lengths = list(range(len(rows))), [0] * len(rows)
            slot_of = {request: slot for slot, request in enumerate(rows)}
            for slot, request in enumerate(rows):
                deepest = self._deepest[request]
                if deepest < 0:
                    continue
                first = self._holders[self._nodes[request][deepest]][0]
                if first is not request:
                    share_rows[slot] = slot_of[first]
                    share_lengths[slot] = (deepest + 1) * self.block_size
            self._sources = list(rows), share_rows, share_lengths
        return self._sources[1], self._sources[2]
