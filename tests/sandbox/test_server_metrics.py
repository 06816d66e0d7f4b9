"""ServerMetrics and what it reports: admission queue, verdict counts, nearest-rank latency percentiles."""

from __future__ import annotations

import asyncio

import pytest

from sandbox.admission import Admission
from sandbox.metrics import ServerMetrics, nearest_rank_percentile
from sandbox.types import Verdict


def test_nearest_rank_percentile_picks_the_smallest_value_covering_the_fraction() -> None:
    values = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0]
    assert nearest_rank_percentile(values, 0.5) == 50.0
    assert nearest_rank_percentile(values, 0.9) == 90.0
    assert nearest_rank_percentile(values, 0.99) == 100.0
    assert nearest_rank_percentile([7.0], 0.5) == 7.0


async def test_a_run_waiting_for_the_only_slot_is_counted_as_queued_not_in_flight() -> None:
    admission = Admission(max_concurrency=1, cpu_slots=1, memory_budget_mb=1024, cpu_probe=None)
    metrics = ServerMetrics()
    release = asyncio.Event()

    async def hold_slot() -> None:
        async with admission.admit(256):
            await release.wait()
        metrics.record(Verdict.AC, 0.1)

    first = asyncio.create_task(hold_slot())
    second = asyncio.create_task(hold_slot())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    busy = metrics.snapshot(admission.state())
    assert (busy.in_flight, busy.queue_depth, busy.memory_in_flight_mb, busy.latency.num_samples) == (
        1,
        1,
        256,
        0,
    )
    release.set()
    await asyncio.gather(first, second)
    idle = metrics.snapshot(admission.state())
    assert (idle.in_flight, idle.queue_depth, idle.memory_in_flight_mb, idle.latency.num_samples) == (
        0,
        0,
        0,
        2,
    )


def test_verdict_counts_list_every_verdict_and_sum_to_the_number_of_runs() -> None:
    metrics = ServerMetrics()
    for verdict in (Verdict.AC, Verdict.WA, Verdict.AC, Verdict.SANDBOX_ERROR):
        metrics.record(verdict, 0.5)
    admission = Admission(max_concurrency=16, cpu_slots=2, memory_budget_mb=4096, cpu_probe=None)
    snapshot = metrics.snapshot(admission.state(), backend_stats={"num_started": 5, "num_recycled": 3})
    assert snapshot.num_runs == 4
    assert snapshot.verdicts[Verdict.AC] == 2
    assert snapshot.verdicts[Verdict.WA] == 1
    assert snapshot.verdicts[Verdict.SANDBOX_ERROR] == 1
    assert snapshot.verdicts[Verdict.TLE] == 0
    assert (snapshot.max_concurrency, snapshot.cpu_slots, snapshot.memory_budget_mb) == (16, 2, 4096)
    assert snapshot.container_recycles == 3
    assert snapshot.backend_stats == {"num_started": 5, "num_recycled": 3}
    assert snapshot.latency.p50_ms == 500.0


@pytest.mark.parametrize(
    "arguments,message",
    [
        ({"max_concurrency": 0, "cpu_slots": 1}, "max_concurrency must be >= 1, got 0"),
        ({"max_concurrency": 2, "cpu_slots": 3}, r"cpu_slots \(3\) must be <= max_concurrency \(2\)"),
    ],
)
def test_impossible_admission_bounds_are_rejected_with_the_bad_value(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Admission(**arguments, memory_budget_mb=1024)
