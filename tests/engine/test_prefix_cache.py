"""Prefix cache: block lookup and LRU eviction, and cache hits that change nothing but the work done."""

from __future__ import annotations

import asyncio
import gc

import pytest
import torch

from agentrl.engine import SamplingParams, StepKind, TransformersEngine
from agentrl.engine.builtin.cache.prefix_cache import CachedPath, PrefixCache
from agentrl.engine.builtin.cache.slot_cache import SlotKVCache
from tests.engine.conftest import on_cpu, tiny_qwen2
from tests.engine.test_transformers_engine import assert_same_generations

BLOCK = 4
BYTES_PER_TOKEN = 2 * 4  # one layer, one head, head_dim 1, float32 keys and values
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]  # two full blocks of 4 and two tokens


def cache_of(num_blocks: int) -> PrefixCache:
    slots = SlotKVCache(
        num_layers=1, num_slots=2, num_kv_heads=1, head_dim=1, max_capacity=16,
        dtype=torch.float32, device=torch.device("cpu"), initial_capacity=16,
    )  # fmt: skip
    slots.keys[0, :, 0, :, 0] = torch.arange(32.0).view(2, 16)
    return PrefixCache(slots, block_size=BLOCK, budget_bytes=num_blocks * BLOCK * BYTES_PER_TOKEN)


def test_only_full_blocks_of_an_identical_prefix_are_found():
    cache = cache_of(num_blocks=8)
    assert cache.insert_from_slots([(PROMPT, 0)]) == [CachedPath([1, 2], num_added=2)]
    assert cache.peek(PROMPT) == 8
    assert cache.peek(PROMPT[:8] + [7, 7, 7, 7]) == 8
    assert cache.peek(PROMPT[:7]) == 4
    assert cache.peek([3, 1, 4, 2] + PROMPT[4:]) == 0  # a different first block hides the second
    # Only the new third block is stored; the path names the two found first.
    assert cache.insert_from_slots([(PROMPT + [8, 8], 0)]) == [CachedPath([1, 2, 3], num_added=1)]


def test_cached_blocks_leave_the_garbage_collectors_watch():
    # A full collection walks every object it tracks while every thread waits: tens of thousands
    # of cached blocks must not add to it.
    cache = cache_of(num_blocks=8)
    cache.insert_from_slots([(PROMPT, 0), (PROMPT[4:] + [8, 8, 8, 8], 1)])
    gc.collect()  # a tuple is untracked by the first collection that finds only untracked items in it:
    gc.collect()  # a key's tuple of tokens by the first, the key itself by the second
    entries = [*cache._blocks.keys(), *cache._blocks.values()]
    assert len(entries) == 2 * 4 and not any(gc.is_tracked(entry) for entry in entries)


def test_a_hit_copies_the_cached_keys_and_values_into_another_slot():
    cache = cache_of(num_blocks=8)
    cache.insert_from_slots([(PROMPT, 0)])
    match = cache.lookup(PROMPT[:9])
    assert (match.block_ids, match.node_ids, match.num_tokens) == ([0, 1], [1, 2], 8)
    cache.copy_into_slots([(match, 1)])
    assert cache.slots.keys[0, 1, 0, :, 0].tolist() == list(range(8)) + list(range(24, 32))


def test_one_copy_places_each_match_in_its_own_slot():
    cache = cache_of(num_blocks=8)
    cache.insert_from_slots([(PROMPT, 0)])
    cache.slots.keys.zero_()
    cache.copy_into_slots([(cache.lookup(PROMPT[:4]), 0), (cache.lookup(PROMPT), 1)])
    assert cache.slots.keys[0, :, 0, :8, 0].tolist() == [[0, 1, 2, 3, 0, 0, 0, 0], list(range(8))]


def test_one_insert_never_evicts_a_block_it_added_itself():
    cache = cache_of(num_blocks=2)
    first, second = [1, 1, 1, 1, 2, 2, 2, 2], [5, 5, 5, 5]
    # The pool is full after `first`: `second` gets no block.
    assert cache.insert_from_slots([(first, 0), (second, 1)]) == [CachedPath([1, 2], 2), CachedPath([], 0)]
    assert (cache.peek(first), cache.peek(second)) == (8, 0)
    assert cache.keys[0, :, 0, :, 0].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_the_least_recently_used_leaf_is_evicted_first_when_the_budget_is_full():
    cache = cache_of(num_blocks=3)
    first = [1, 1, 1, 1, 2, 2, 2, 2]
    second = [1, 1, 1, 1, 3, 3, 3, 3]  # shares the first block
    cache.insert_from_slots([(first, 0)])
    cache.insert_from_slots([(second, 0)])
    cache.lookup(first)  # now `second`'s own block is the least recently used
    # Evicted, `second`'s block 3 goes to the new one, under a node id never used before.
    assert cache.insert_from_slots([([4, 4, 4, 4], 0)]) == [CachedPath([4], num_added=1)]
    assert (cache.peek(first), cache.peek(second), cache.peek([4, 4, 4, 4])) == (8, 4, 4)
    cache.clear()
    assert (cache.peek(first), cache.num_cached_blocks) == (0, 0)


def test_a_budget_below_one_block_is_rejected_with_the_fix():
    # tiny_qwen2 stores 2 layers x 2 heads x head_dim 8 x float32 keys and values: 256 bytes a token.
    with pytest.raises(
        ValueError, match=r"prefix_cache_bytes=1000 holds no block of 4 tokens \(1024 bytes\)"
    ):
        TransformersEngine(tiny_qwen2(), [], on_cpu(prefix_block_size=4, prefix_cache_bytes=1000))


def engine(model, on_step=None, **knobs) -> TransformersEngine:
    return TransformersEngine(model, [], on_cpu(prefix_block_size=BLOCK, **knobs), on_step=on_step)


GROUP = [SamplingParams(max_new_tokens=6, temperature=1.0, seed=seed) for seed in range(4)]


async def test_a_group_prefills_its_shared_prompt_once_and_samples_what_cold_prefill_samples():
    model, records = tiny_qwen2(), []
    async with engine(model, on_step=records.append) as cached:
        hits = await asyncio.gather(*[cached.generate(PROMPT, params) for params in GROUP])
    async with engine(model, prefix_cache_bytes=0) as cold:
        misses = await asyncio.gather(*[cold.generate(PROMPT, params) for params in GROUP])
    assert_same_generations(hits, misses)
    prefills = [(r.request_ids, r.num_tokens) for r in records if r.kind is StepKind.PREFILL]
    # The first member prefills all 10 tokens; the others follow in the same iteration's next pass
    # and feed only the last 2.
    assert prefills == [((0,), 10), ((1, 2, 3), 3 * 2)]
    assert [r.kind for r in records[:3]] == [StepKind.PREFILL, StepKind.PREFILL, StepKind.DECODE]
    assert (cached.stats.num_prompt_tokens, cached.stats.num_prefix_cached_tokens) == (40, 24)


async def test_a_bad_prompt_among_cache_hits_fails_alone_and_the_hits_sample_what_cold_prefill_samples():
    model = tiny_qwen2()
    prompts = [
        PROMPT + [11],
        PROMPT + [64],
        PROMPT + [12],
    ]  # the middle one feeds a token outside the vocabulary
    async with engine(model) as cached:
        await cached.generate(PROMPT, GROUP[0])  # caches the shared prompt's two full blocks
        before = cached.stats.num_prefix_cached_tokens
        got = await asyncio.gather(
            *[cached.generate(p, s) for p, s in zip(prompts, GROUP[1:], strict=True)], return_exceptions=True
        )
        read = cached.stats.num_prefix_cached_tokens - before
    async with engine(model, prefix_cache_bytes=0) as cold:
        expected = [await cold.generate(prompts[i], GROUP[1 + i]) for i in (0, 2)]
    assert isinstance(got[1], ValueError) and str(got[1]).startswith("prompt token id 64 is outside")
    assert_same_generations([got[0], got[2]], expected)
    assert read == 2 * 2 * BLOCK  # each hit read both full blocks; the failed request read nothing


async def test_the_next_turn_reuses_the_previous_turns_keys_and_values():
    model = tiny_qwen2()
    first_turn = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5)
    observation = [7, 8, 9]
    results = {}
    for name, budget in (("cached", 1 << 20), ("cold", 0)):
        async with engine(model, prefix_cache_bytes=budget) as turns:
            one = await turns.generate(PROMPT, first_turn)
            two = await turns.generate(
                PROMPT + one.completion_ids + observation, SamplingParams(max_new_tokens=8, seed=6)
            )
            results[name] = ([one, two], turns.stats.num_prefix_cached_tokens)
    assert_same_generations(results["cached"][0], results["cold"][0])
    # Turn one leaves 10 prompt + 7 fed completion tokens: four full blocks for turn two.
    assert (results["cached"][1], results["cold"][1]) == (16, 0)


async def test_a_weight_update_invalidates_the_cache():
    old_model, new_model = tiny_qwen2(seed=0), tiny_qwen2(seed=1)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=2)
    async with engine(tiny_qwen2(seed=1), prefix_cache_bytes=0) as fresh:
        expected = await fresh.generate(PROMPT, params)
    async with engine(old_model) as updated:
        await updated.generate(PROMPT, params)
        assert updated.prefix_cache.num_cached_blocks == 3  # 10 prompt + 5 fed completion tokens
        await updated.update_weights(new_model.state_dict(), version=1)
        assert updated.prefix_cache.num_cached_blocks == 0
        after = await updated.generate(PROMPT, params)
    assert_same_generations([after], [expected])
    assert updated.stats.num_prefix_cached_tokens == 0
