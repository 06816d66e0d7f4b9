"""Which waiting requests a prefill pass takes: the token budget, padded or packed."""

from __future__ import annotations

import collections
import random

from agentrl.engine.builtin.scheduler.admission import admit
from agentrl.engine.builtin.scheduler.request import Request
from agentrl.engine.protocol import SamplingParams


def waiting(*prompt_lengths: int) -> collections.deque:
    return collections.deque(
        Request(
            i, list(range(1, n + 1)), SamplingParams(max_new_tokens=1), 1, frozenset(), random.Random(i), None
        )
        for i, n in enumerate(prompt_lengths)
    )


def test_a_padded_pass_pays_its_width_for_every_row_and_a_packed_pass_its_prompt_tokens():
    queue = waiting(100, 10, 10, 10)
    # Padded: 100 + 10 tokens still cost 2 rows x 100 wide = 200 > 150, so the first row goes alone.
    assert [
        r.request_id for r in admit(queue, num_free_rows=8, budget=150, first_pass=True, prefix_cache=None)
    ] == [0]
    queue = waiting(100, 10, 10, 10)
    packed = admit(queue, num_free_rows=8, budget=150, first_pass=True, prefix_cache=None, packed=True)
    assert [r.request_id for r in packed] == [0, 1, 2, 3]  # 130 tokens fed


def test_the_first_pass_takes_its_first_request_however_long_and_rows_cap_the_pass():
    queue = waiting(500, 10)
    assert [
        r.request_id
        for r in admit(queue, num_free_rows=8, budget=100, first_pass=True, prefix_cache=None, packed=True)
    ] == [0]
    assert admit(queue, num_free_rows=8, budget=5, first_pass=False, prefix_cache=None, packed=True) == []
    assert [
        r.request_id
        for r in admit(waiting(1, 1, 1), num_free_rows=2, budget=100, first_pass=True, prefix_cache=None)
    ] == [0, 1]
