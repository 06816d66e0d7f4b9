"""Service metrics of the sandbox HTTP server: queue depth, in-flight runs, verdicts, latency.

The server admits every run through `ServerMetrics.admit()`, which bounds concurrency (the same
bound as the executor's, so the queue is visible here rather than hidden inside the executor) and
records how long each run took from arrival to verdict. `snapshot()` is what `GET /metrics` returns.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pydantic import BaseModel

from sandbox.types import Verdict

# Percentiles are over a window of recent runs so a long-lived server reports current behaviour
# and its memory stays bounded.
LATENCY_WINDOW = 4096
SERVICE_WINDOW = 64  # recent enough to follow a burst of slow programs


class LatencyPercentiles(BaseModel):
    """Request latency (queue wait + execution), milliseconds, over the recent window."""

    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    num_samples: int


class MetricsSnapshot(BaseModel):
    """What `GET /metrics` reports."""

    uptime_s: float
    max_concurrency: int
    queue_depth: int  # runs waiting for an execution slot
    in_flight: int  # runs executing now
    num_runs: int  # runs finished since start
    verdicts: dict[Verdict, int]
    latency: LatencyPercentiles
    container_recycles: int | None  # None when the backend does not report recycles
    backend_stats: dict[str, int] | None  # the backend's own counters, when it keeps any


def nearest_rank_percentile(sorted_values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of an ascending list: the smallest value covering `fraction`."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


class ServerMetrics:
    """Counts and latencies of the runs served, plus the admission bound that creates the queue."""

    def __init__(self, max_concurrency: int) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.max_concurrency = max_concurrency
        self._slots = asyncio.Semaphore(max_concurrency)
        self._started = time.monotonic()
        self._queued = 0
        self._in_flight = 0
        self._verdicts: Counter[Verdict] = Counter()
        self._latencies_s: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self._service_s: deque[float] = deque(maxlen=SERVICE_WINDOW)  # execution only, for estimates

    @asynccontextmanager
    async def admit(self, max_wait_s: float | None = None) -> AsyncIterator[None]:
        """Wait for an execution slot, then hold it for the body of the `async with`.

        Raises TimeoutError, having left the queue, when no slot frees up within `max_wait_s`.
        """
        arrived = time.monotonic()
        self._queued += 1
        try:
            async with asyncio.timeout(max_wait_s):
                await self._slots.acquire()
        finally:
            self._queued -= 1
        self._in_flight += 1
        started = time.monotonic()
        try:
            yield
        finally:
            self._in_flight -= 1
            self._slots.release()
            self._latencies_s.append(time.monotonic() - arrived)
            self._service_s.append(time.monotonic() - started)

    def estimated_wait_s(self, num_requests: int = 1) -> float:
        """How long `num_requests` arriving now would wait for slots: the runs queued ahead of
        them (and their own beyond the free slots), at the recent mean execution time."""
        if not self._service_s:
            return 0.0
        mean_s = sum(self._service_s) / len(self._service_s)
        waiting = self._queued + self._in_flight + num_requests - self.max_concurrency
        return max(0.0, waiting / self.max_concurrency * mean_s)

    def record_verdict(self, verdict: Verdict) -> None:
        self._verdicts[verdict] += 1

    def snapshot(self, backend_stats: dict[str, int] | None = None) -> MetricsSnapshot:
        """The current state; `backend_stats` are the backend's counters (num_recycled: recycles)."""
        latencies = sorted(self._latencies_s)
        percentiles = {
            name: round(1000 * nearest_rank_percentile(latencies, fraction), 3) if latencies else None
            for name, fraction in (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99))
        }
        return MetricsSnapshot(
            uptime_s=round(time.monotonic() - self._started, 3),
            max_concurrency=self.max_concurrency,
            queue_depth=self._queued,
            in_flight=self._in_flight,
            num_runs=sum(self._verdicts.values()),
            verdicts={verdict: self._verdicts[verdict] for verdict in Verdict},
            latency=LatencyPercentiles(**percentiles, num_samples=len(latencies)),
            container_recycles=(backend_stats or {}).get("num_recycled"),
            backend_stats=backend_stats,
        )
