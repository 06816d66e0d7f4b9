"""Shared prefixes at decode: which blocks a slot holds bit for bit, and whose slot each row reads them from."""

from __future__ import annotations

import asyncio

from agentrl.engine import SamplingParams, TransformersEngine
from agentrl.engine.builtin.cache.prefix_cache import CachedPath
from agentrl.engine.builtin.scheduler.prefix_sharing import SharedPrefixes, slot_nodes
from tests.engine.conftest import on_cpu, tiny_qwen2
from tests.engine.test_transformers_engine import assert_same_generations


def test_a_slot_holds_the_blocks_it_copied_and_the_blocks_copied_from_it():
    assert slot_nodes([1, 2], CachedPath([1, 2, 3], num_added=1)) == [1, 2, 3]
    assert slot_nodes([], CachedPath([5, 6], num_added=2)) == [5, 6]  # cold: every block came from it
    # The pass wrote the copied second block's last position again (a whole-prompt hit): not the same bits.
    assert slot_nodes([1], CachedPath([1, 2], num_added=0)) == [1]
    # Computed by itself while another row's copy went into the cache in the same insert.
    assert slot_nodes([], CachedPath([5, 6], num_added=0)) == []
    assert slot_nodes([1], CachedPath([1, 6, 7], num_added=1)) == [1]
    # Its copied second block was evicted before the insert, which added the slot's own copy again.
    assert slot_nodes([1, 2], CachedPath([1, 7], num_added=1)) == [1, 7]


def test_each_row_reads_its_deepest_shared_block_and_those_before_from_the_first_row_that_took_it():
    a, b, c, d = object(), object(), object(), object()  # rows are told apart by identity alone
    shared = SharedPrefixes(block_size=16)
    shared.join(a, [1, 2])
    shared.join(b, [1, 2, 3])
    shared.join(c, [1, 4])
    shared.join(d, [9])
    assert shared.sources([a, b, c, d]) == ([0, 0, 0, 3], [0, 32, 16, 0])
    assert shared.sources([d, c, b, a]) == ([0, 3, 3, 3], [0, 16, 32, 0])  # rows moved: same sources
    shared.leave(a)  # b now holds block 2 alone, and is the first holder of block 1
    assert shared.sources([b, c, d]) == ([0, 0, 2], [0, 16, 0])
    shared.leave(b)
    assert shared.sources([c, d]) == ([0, 1], [0, 0])
    shared.join(a, [1, 2])  # a new row that shares with c
    assert shared.sources([c, d, a]) == ([0, 1, 0], [0, 0, 16])
    shared.clear()  # the batch failed: a row joining now shares with none of the rows before
    shared.join(c, [1, 4])
    assert shared.sources([c]) == ([0], [0])


PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]  # two full blocks of 4 and two tokens
OTHER = [7, 7, 7, 7, 8, 8]


async def test_a_groups_members_read_their_shared_prompt_from_the_first_members_slot():
    model = tiny_qwen2()
    group = [SamplingParams(max_new_tokens=5, temperature=1.0, seed=seed) for seed in range(3)]
    staged = []
    async with TransformersEngine(model, [], on_cpu(prefix_block_size=4)) as engine:
        stage = engine.runner.stage_decode

        def recording_stage(*args):
            staged.append(args[-1])
            return stage(*args)

        engine.runner.stage_decode = recording_stage
        got = await asyncio.gather(
            engine.generate(PROMPT, group[0]),
            engine.generate(OTHER, group[0]),
            *[engine.generate(PROMPT, params) for params in group[1:]],
        )
    async with TransformersEngine(model, [], on_cpu(prefix_cache_bytes=0)) as cold:
        expected = await asyncio.gather(
            *[
                cold.generate(p, s)
                for p, s in zip([PROMPT, OTHER, PROMPT, PROMPT], [group[0]] + group, strict=True)
            ]
        )
    assert_same_generations(got, expected)
    # The first pass prefills the first member and OTHER; the other members copy both full blocks
    # of the prompt from the cache, and read them from the first member's slot at every step.
    assert staged[0] == ([0, 1, 0, 0], [0, 0, 8, 8])
    assert all(shares == staged[0] for shares in staged)
