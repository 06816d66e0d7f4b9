"""Admission of runs (request -> [admission] -> judge): a run starts when the CPU can take it.

A run that sleeps or waits leaves its core idle, so one slot per core held for a run's whole wall
time makes quick runs queue behind sleeping ones. A waiting run is admitted, in arrival order, when
- fewer than `max_concurrency` runs are in flight (a bound on jails, memory and processes, not cores),
- the memory limits of the runs in flight leave room for its own within `memory_budget_mb`, and
- fewer than `cpu_slots` runs are in flight, or the runs in flight leave at least `MIN_IDLE_CORES`
  idle: the cores they used over the last `WINDOW_S` (or, if more, how many of their processes
  were running or ready to run, on average: what they would use if other work on the host did not
  take the CPU), plus one whole core for each run admitted within that window (the measurement
  cannot see it yet).
Both are measured by the backend's probe (see `sandbox.executor`): over this process's descendants,
from /proc, for the bwrap and unsafe-local backends, whose jails are our children; over its
containers' cgroups for Docker, whose containers' processes are the engine's children
(sandbox.backends.docker_cpu). Time limits stay per-run CPU limits with a wall-clock cap; the CPU
gate keeps CPU-bound runs from sharing cores, so that their verdicts do not depend on the load.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

WINDOW_S = 0.3  # CPU use is measured over this much recent time
MIN_SAMPLE_INTERVAL_S = 0.05
MAX_SCAN_SHARE = 0.05  # reading /proc may take at most this share of one core
MIN_IDLE_CORES = 0.5
CPU_WINDOW = 64  # runs whose CPU time estimates the queue's wait
RUNS_PER_CPU = 8  # runs in flight per core, by default, where the admission measures their CPU use
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuUsage:
    """One look at the CPU use of a group of processes."""

    cpu_s: float  # CPU seconds used so far
    num_runnable: int  # processes running or ready to run now


def descendant_cpu_usage() -> CpuUsage:
    """The CPU use of this process's descendants: CPU seconds of the live ones (with the children
    they reaped) and of the children this process reaped; how many are runnable (state R) now.
    Threads of this process do not count."""
    root = os.getpid()
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    runnable: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            descriptor = os.open(f"/proc/{name}/stat", os.O_RDONLY)
        except OSError:  # it exited meanwhile
            continue
        try:
            stat = os.read(descriptor, 4096)
        except OSError:
            continue
        finally:
            os.close(descriptor)
        # Fields after the parenthesised command (which may hold spaces): state, ppid, ..., then
        # utime, stime, cutime, cstime at positions 11-14.
        fields = stat[stat.rindex(b")") + 2 :].split()
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)
        ticks[pid] = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        if fields[0] == b"R":
            runnable.add(pid)
    total, num_runnable, stack = 0, 0, list(children.get(root, []))
    while stack:
        pid = stack.pop()
        total += ticks[pid]
        num_runnable += pid in runnable
        stack.extend(children.get(pid, []))
    reaped = os.times()
    return CpuUsage(reaped.children_user + reaped.children_system + total / CLOCK_TICKS_PER_S, num_runnable)


class AdmissionTimeout(TimeoutError):
    """The run could not start within its maximum wait; nothing of it ran."""


@dataclass(frozen=True)
class AdmissionState:
    """What the admission looks like now, for metrics."""

    max_concurrency: int
    cpu_slots: int
    num_waiting: int
    num_running: int
    busy_cores: float | None  # measured CPU use of the runs; None when not measured
    memory_in_flight_mb: int
    memory_budget_mb: int


@dataclass(eq=False)
class _Run:
    memory_mb: int
    admitted_at: float = 0.0


class Admission:
    """Starts runs by CPU, memory and a concurrency bound; waiting runs are admitted in arrival order.

    `cpu_probe` looks at the runs' CPU use; None admits by the concurrency and memory bounds alone
    (use `max_concurrency == cpu_slots` then).
    """

    def __init__(
        self,
        max_concurrency: int,
        cpu_slots: int,
        memory_budget_mb: int,
        cpu_probe: Callable[[], CpuUsage] | None = descendant_cpu_usage,
    ) -> None:
        for name, value in (("max_concurrency", max_concurrency), ("cpu_slots", cpu_slots)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if cpu_slots > max_concurrency:
            raise ValueError(f"cpu_slots ({cpu_slots}) must be <= max_concurrency ({max_concurrency})")
        if memory_budget_mb < 1:
            raise ValueError(f"memory_budget_mb must be >= 1, got {memory_budget_mb}")
        self.max_concurrency = max_concurrency
        self.cpu_slots = cpu_slots
        self.memory_budget_mb = memory_budget_mb
        self._cpu_probe = cpu_probe
        self._waiting: deque[tuple[_Run, asyncio.Future[None]]] = deque()
        self._running: set[_Run] = set()
        self._memory_mb = 0
        self._samples: deque[tuple[float, CpuUsage]] = deque()  # (monotonic time, usage), oldest first
        self._sampler: asyncio.Task[None] | None = None
        self._run_cpu_s: deque[float] = deque(maxlen=CPU_WINDOW)

    @asynccontextmanager
    async def admit(self, memory_mb: int, max_wait_s: float | None = None) -> AsyncIterator[None]:
        """Wait until the run may start, then hold its place for the body of the `async with`.

        Raises AdmissionTimeout, having left the queue, when it cannot start within `max_wait_s`.
        """
        if memory_mb > self.memory_budget_mb:
            raise ValueError(
                f"a run of {memory_mb} MB can never fit the memory budget of {self.memory_budget_mb} MB"
            )
        run = _Run(memory_mb)
        if not self._waiting and self._can_start(run):
            self._start(run)
        else:
            await self._wait(run, max_wait_s)
        try:
            yield
        finally:
            self._finish(run)

    async def _wait(self, run: _Run, max_wait_s: float | None) -> None:
        admitted = asyncio.get_running_loop().create_future()
        entry = (run, admitted)
        self._waiting.append(entry)
        self._ensure_sampler()
        try:
            async with asyncio.timeout(max_wait_s):
                await admitted
        except BaseException as error:
            if admitted.done() and not admitted.cancelled():  # admitted just as the wait ended
                self._finish(run)
            else:
                if entry in self._waiting:  # a cancelled entry may already have been passed over
                    self._waiting.remove(entry)
                self._admit_waiting()  # the head may have changed
            if isinstance(error, TimeoutError):
                raise AdmissionTimeout(f"no room to start within {max_wait_s:g} s") from None
            raise

    def _can_start(self, run: _Run) -> bool:
        if len(self._running) >= self.max_concurrency:
            return False
        if self._memory_mb + run.memory_mb > self.memory_budget_mb:
            return False
        if len(self._running) < self.cpu_slots or self._cpu_probe is None:
            return True
        now = time.monotonic()
        unseen = sum(now - other.admitted_at < WINDOW_S for other in self._running)
        busy = self.busy_cores()
        return busy is not None and busy + unseen <= self.cpu_slots - MIN_IDLE_CORES

    def _start(self, run: _Run) -> None:
        run.admitted_at = time.monotonic()
        self._running.add(run)
        self._memory_mb += run.memory_mb
        self._ensure_sampler()

    def _finish(self, run: _Run) -> None:
        self._running.discard(run)
        self._memory_mb -= run.memory_mb
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        while self._waiting and self._can_start(self._waiting[0][0]):
            run, admitted = self._waiting.popleft()
            if not admitted.done():
                self._start(run)
                admitted.set_result(None)

    def busy_cores(self) -> float | None:
        """The cores the runs used over the recent window, or how many of their processes were
        runnable on average, whichever is more; None before two samples exist."""
        if len(self._samples) < 2:
            return None
        (first_time, first), (last_time, last) = self._samples[0], self._samples[-1]
        used = max(0.0, last.cpu_s - first.cpu_s) / max(last_time - first_time, 1e-6)
        wanted = sum(usage.num_runnable for _, usage in self._samples) / len(self._samples)
        return max(used, wanted)

    def _ensure_sampler(self) -> None:
        if self._cpu_probe is not None and (self._sampler is None or self._sampler.done()):
            self._samples.clear()
            self._sampler = asyncio.create_task(self._sample(self._cpu_probe))

    async def _sample(self, cpu_probe: Callable[[], CpuUsage]) -> None:
        """Measure while anything runs or waits, re-checking the queue after every sample."""
        while self._running or self._waiting:
            started = time.monotonic()
            usage = await asyncio.to_thread(cpu_probe)  # a scan of /proc takes milliseconds
            now = time.monotonic()
            self._samples.append((now, usage))
            while len(self._samples) > 2 and self._samples[1][0] <= now - WINDOW_S:
                self._samples.popleft()
            self._admit_waiting()
            # On a host with many processes a scan costs more: sample less often, not more CPU.
            await asyncio.sleep(max(MIN_SAMPLE_INTERVAL_S, (now - started) / MAX_SCAN_SHARE))

    def record_cpu_s(self, cpu_s: float) -> None:
        """The CPU time a finished run used (as the backend measured it), for `estimated_wait_s`."""
        self._run_cpu_s.append(cpu_s)

    def estimated_wait_s(self, num_runs: int = 1) -> float:
        """How long `num_runs` arriving now would wait: the CPU that the runs queued ahead of them and
        their own need, at the recent mean CPU time per run, spread over the CPU slots. Zero when
        they would start at once, or no finished run says how much CPU a run takes."""
        if not self._run_cpu_s or (not self._waiting and len(self._running) + num_runs <= self.cpu_slots):
            return 0.0
        mean_cpu_s = sum(self._run_cpu_s) / len(self._run_cpu_s)
        return (len(self._waiting) + num_runs) * mean_cpu_s / self.cpu_slots

    def state(self) -> AdmissionState:
        return AdmissionState(
            max_concurrency=self.max_concurrency,
            cpu_slots=self.cpu_slots,
            num_waiting=len(self._waiting),
            num_running=len(self._running),
            busy_cores=self.busy_cores() if self._running else None,
            memory_in_flight_mb=self._memory_mb,
            memory_budget_mb=self.memory_budget_mb,
        )
