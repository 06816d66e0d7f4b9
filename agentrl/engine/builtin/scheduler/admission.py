"""Inference stage, admission: which waiting requests the next prefill pass takes.

Requests are taken in submission order, up to the free batch rows and the pass's token budget:
the tokens it computes, which is its left-padded width times its rows, or with packed prefill
(the fused forward, which drops the padding) the prompt tokens it feeds. A request whose next uncached prompt block a request
already taken is about to compute is passed over: the iteration's next prefill pass, right after
this one, finds that block cached and takes it, so a group's members prefill their shared prompt
once.
"""

from __future__ import annotations

import collections

from agentrl.engine.builtin.cache.prefix_cache import PrefixCache
from agentrl.engine.builtin.scheduler.request import Request


def admit(
    waiting: collections.deque,
    *,
    num_free_rows: int,
    budget: int,
    first_pass: bool,
    prefix_cache: PrefixCache | None,
    packed: bool = False,
) -> list[Request]:
    """Pop the requests of the next prefill pass from the front of `waiting` (which may hold other commands).

    The first pass of an iteration always takes its first request, however long.
    """
    admitted: list[Request] = []
    passed_over: list[Request] = []
    width = fed = 0
    pending_blocks: set[int] = set()
    while waiting and isinstance(waiting[0], Request) and len(admitted) < num_free_rows:
        prompt = waiting[0].prompt_ids
        cached, blocks, next_block = 0, [], 0
        if prefix_cache is not None:
            cached = prefix_cache.peek(prompt)
            blocks = block_hashes(prompt, prefix_cache.block_size)
            next_block = cached // prefix_cache.block_size
        if len(blocks) > next_block and blocks[next_block] in pending_blocks:
            passed_over.append(waiting.popleft())
            continue
        suffix = len(prompt) - min(cached, len(prompt) - 1)  # the last prompt token is always fed
        new_width, new_fed = max(width, suffix), fed + suffix
        cost = new_fed if packed else new_width * (len(admitted) + 1)
        if (admitted or not first_pass) and cost > budget:
            break
        admitted.append(waiting.popleft())
        pending_blocks.update(blocks[next_block:])
        width, fed = new_width, new_fed
    waiting.extendleft(reversed(passed_over))  # back in submission order
    return admitted


def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """One hash per full block, chained so that equal hashes mean equal prefixes (up to collisions)."""
    hashes, previous = [], 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        previous = hash((previous, tuple(token_ids[start : start + block_size])))
        hashes.append(previous)
    return hashes
