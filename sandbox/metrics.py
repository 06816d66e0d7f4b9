"""Service metrics of the sandbox HTTP server: admission, connections, verdicts, latency.

The server records every run it served (`ServerMetrics.record`); the executor's admission and the
connection guard report their own state. `snapshot()` is what `GET /metrics` returns.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque

from pydantic import BaseModel

from sandbox.admission import AdmissionState
from sandbox.types import Verdict

# Percentiles are over a window of recent runs so a long-lived server reports current behaviour
# and its memory stays bounded.
LATENCY_WINDOW = 4096


class LatencyPercentiles(BaseModel):
    """Request latency (queue wait + execution), milliseconds, over the recent window."""

    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    num_samples: int


class ConnectionCounts(BaseModel):
    """The server's connections: open now, and those the connection cap dropped or refused."""

    num_open: int
    max_connections: int
    num_dropped: int  # displaced at the cap before they finished a request
    num_refused: int  # answered 503 at the cap, every connection having a request in service


class MetricsSnapshot(BaseModel):
    """What `GET /metrics` reports."""

    uptime_s: float
    max_concurrency: int  # runs in flight at most, sleeping ones included
    cpu_slots: int  # runs always admitted; beyond them, only while a core is idle
    queue_depth: int  # runs waiting to be admitted
    in_flight: int  # runs executing now
    busy_cores: float | None  # the runs' measured CPU use; None when idle or not measured
    memory_in_flight_mb: int  # the memory limits of the runs in flight, added up
    memory_budget_mb: int
    num_runs: int  # runs finished since start
    verdicts: dict[Verdict, int]
    latency: LatencyPercentiles
    connections: ConnectionCounts | None
    container_recycles: int | None  # None when the backend does not report recycles
    backend_stats: dict[str, int] | None  # the backend's own counters, when it keeps any


def nearest_rank_percentile(sorted_values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of an ascending list: the smallest value covering `fraction`."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


class ServerMetrics:
    """Counts and latencies of the runs served."""

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._verdicts: Counter[Verdict] = Counter()
        self._latencies_s: deque[float] = deque(maxlen=LATENCY_WINDOW)

    def record(self, verdict: Verdict, latency_s: float) -> None:
        """One run served: its verdict and the time from its arrival to its verdict."""
        self._verdicts[verdict] += 1
        self._latencies_s.append(latency_s)

    def snapshot(
        self,
        admission: AdmissionState,
        connections: ConnectionCounts | None = None,
        backend_stats: dict[str, int] | None = None,
    ) -> MetricsSnapshot:
        """The current state; `backend_stats` are the backend's counters (num_recycled: recycles)."""
        latencies = sorted(self._latencies_s)
        percentiles = {
            name: round(1000 * nearest_rank_percentile(latencies, fraction), 3) if latencies else None
            for name, fraction in (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99))
        }
        busy = admission.busy_cores
        return MetricsSnapshot(
            uptime_s=round(time.monotonic() - self._started, 3),
            max_concurrency=admission.max_concurrency,
            cpu_slots=admission.cpu_slots,
            queue_depth=admission.num_waiting,
            in_flight=admission.num_running,
            busy_cores=None if busy is None else round(busy, 3),
            memory_in_flight_mb=admission.memory_in_flight_mb,
            memory_budget_mb=admission.memory_budget_mb,
            num_runs=sum(self._verdicts.values()),
            verdicts={verdict: self._verdicts[verdict] for verdict in Verdict},
            latency=LatencyPercentiles(**percentiles, num_samples=len(latencies)),
            connections=connections,
            container_recycles=(backend_stats or {}).get("num_recycled"),
            backend_stats=backend_stats,
        )
