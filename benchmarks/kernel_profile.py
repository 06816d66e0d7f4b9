"""Where a GPU spends a region of a benchmark: kernel time by kind, the longest kernels, and idle gaps.

The benchmarks' `--profile` runs one more round of their timed work under torch.profiler
(`with Profiled(device) as region: ...`, then `region.result`) and prints `format_profile`. Kernels launched from CUDA graphs are listed one by one as well. Kinds come from
kernel names (cuBLAS's `nvjet`/`gemm`, flash attention, Triton's `triton_`, ...); a gap is time
inside the region's first-to-last kernel span when no kernel ran, named by the kernels around it.
Profiling slows the host, so the gaps overstate what an unprofiled run loses: compare them with
each other and with the unprofiled timings, not as absolute costs.

With `host_stacks=True` the profiler also records the host's Python calls, and the profile says
which of this project's code each thread was running in the middle of each idle gap (the
engine's scheduler preparing a step, the caller submitting requests, ...): why the GPU waited.
Stack recording slows the host further, so these gaps are longer still.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Self

import torch
from torch.profiler import ProfilerActivity, profile

# (kind, name fragments); the first kind with a fragment in the kernel's name wins.
KINDS = (
    ("attention", ("flash", "attention", "attend", "merge_splits")),
    ("matmul", ("nvjet", "gemm", "xmma", "cutlass", "splitkreduce")),
    ("optimizer, foreach", ("adam", "multi_tensor_apply")),
    ("compiled (triton)", ("triton_",)),
    ("norm", ("rms", "norm")),
    ("activation, rotary", ("silu", "gelu", "rotary")),
    ("copy", ("memcpy", "memset", "copy")),
)
PROJECT_FILES = ("agentrl/", "benchmarks/")  # host calls from these files are attributed idle time
MIN_ATTRIBUTED_GAP_US = 50.0  # shorter gaps are mostly launch latency inside a CUDA graph
NO_PROJECT_CODE = "(no project code running)"


def kind_of(kernel_name: str) -> str:
    name = kernel_name.lower()
    return next((kind for kind, fragments in KINDS if any(f in name for f in fragments)), "other")


@dataclass(frozen=True)
class Kernel:
    name: str
    start_us: float
    end_us: float

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class Gap:
    start_us: float
    end_us: float
    after: str  # the kernel that ran last before the gap
    before: str  # the kernel that starts it

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class HostCall:
    """One call of a project function on the host, from the profiler's Python stack recording."""

    name: str  # as the profiler names it: "agentrl/engine/builtin/runner/model_runner.py(143): decode"
    thread: int
    start_us: float
    end_us: float


@dataclass(frozen=True)
class KernelProfile:
    wall_s: float  # the region, synchronised at both ends, under the profiler
    kernels: tuple[Kernel, ...]  # by start time
    host_calls: tuple[HostCall, ...] = ()  # by start time; recorded only with host stacks

    @property
    def span_us(self) -> float:
        return max(k.end_us for k in self.kernels) - self.kernels[0].start_us if self.kernels else 0.0

    def time_by_kind(self) -> dict[str, float]:
        """Kernel microseconds of each kind, largest first."""
        totals: dict[str, float] = defaultdict(float)
        for kernel in self.kernels:
            totals[kind_of(kernel.name)] += kernel.duration_us
        return dict(sorted(totals.items(), key=lambda item: -item[1]))

    def longest(self, count: int) -> list[tuple[str, float, int]]:
        """(name, total microseconds, calls) of the `count` kernels with the most time."""
        totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for kernel in self.kernels:
            entry = totals[kernel.name]
            entry[0] += kernel.duration_us
            entry[1] += 1
        ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:count]
        return [(name, total, int(calls)) for name, (total, calls) in ranked]

    def gaps(self) -> list[Gap]:
        """Stretches inside the span when no kernel ran (kernels may overlap on several streams)."""
        found = []
        busy_until, last = None, None
        for kernel in self.kernels:
            if busy_until is not None and kernel.start_us > busy_until:
                found.append(Gap(busy_until, kernel.start_us, last.name, kernel.name))
            if busy_until is None or kernel.end_us > busy_until:
                busy_until, last = kernel.end_us, kernel
        return found

    def idle_by_host_code(self, min_gap_us: float = MIN_ATTRIBUTED_GAP_US) -> dict[str, float]:
        """Microseconds of idle gaps of at least `min_gap_us`, by the project code running at their middle.

        A gap counts once for each thread that was inside project code then, under its calls
        "outermost > ... > caller > innermost", or under NO_PROJECT_CODE.
        """
        gaps = sorted(
            ((gap.start_us + gap.end_us) / 2, gap.duration_us)
            for gap in self.gaps()
            if gap.duration_us >= min_gap_us
        )
        totals: dict[str, float] = defaultdict(float)
        active: list[HostCall] = []
        upcoming = iter(self.host_calls)
        pending = next(upcoming, None)
        for middle, duration in gaps:
            while pending is not None and pending.start_us <= middle:
                active.append(pending)
                pending = next(upcoming, None)
            active = [call for call in active if call.end_us > middle]
            stacks: dict[int, list[HostCall]] = defaultdict(list)
            for call in sorted(active, key=lambda call: (call.start_us, -call.end_us)):  # outermost first
                stacks[call.thread].append(call)
            for stack in stacks.values():
                names = [_short(call.name) for call in stack]
                totals[" > ".join(names if len(names) <= 3 else [names[0], "...", *names[-2:]])] += duration
            if not stacks:
                totals[NO_PROJECT_CODE] += duration
        return dict(sorted(totals.items(), key=lambda item: -item[1]))


def _short(call_name: str) -> str:
    """The call's name without the directories of its file: "scheduler.py(167): _launch_decode"."""
    return call_name.rsplit("/", 1)[-1]


class Profiled:
    """A region run under torch.profiler: its CUDA kernels (none on CPU) and its wall time.

    `host_stacks`: also record the host's Python calls (`KernelProfile.host_calls`).
    """

    def __init__(self, device: torch.device, host_stacks: bool = False) -> None:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.device = device
        self.host_stacks = host_stacks
        self._profiler = profile(activities=activities, with_stack=host_stacks)
        self.result: KernelProfile | None = None

    def __enter__(self) -> Self:
        self._profiler.__enter__()
        _synchronize(self.device)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        _synchronize(self.device)
        wall = time.perf_counter() - self._start
        self._profiler.__exit__(*exc_info)
        if self.host_stacks:  # Python calls are only in the exported trace, on the trace's clock
            self.result = KernelProfile(wall, *_read_trace(self._profiler))
            return
        kernels = [
            Kernel(event.name, event.time_range.start, event.time_range.end)
            for event in self._profiler.events()
            if event.device_type == torch.autograd.DeviceType.CUDA
            and event.time_range.end > event.time_range.start
        ]
        self.result = KernelProfile(wall, tuple(sorted(kernels, key=lambda k: k.start_us)))


def _read_trace(profiler: profile) -> tuple[tuple[Kernel, ...], tuple[HostCall, ...]]:
    """Kernels and project host calls, by start time, from the profiler's exported Chrome trace."""
    with tempfile.TemporaryDirectory() as directory:
        path = f"{directory}/trace.json"
        profiler.export_chrome_trace(path)
        with open(path) as file:
            events = json.load(file)["traceEvents"]
    kernels, calls = [], []
    for event in events:
        duration, category = event.get("dur", 0), event.get("cat")
        if duration <= 0:
            continue
        start, end = event["ts"], event["ts"] + duration
        if category in ("kernel", "gpu_memcpy", "gpu_memset"):
            kernels.append(Kernel(event["name"], start, end))
        elif category == "python_function" and any(part in event["name"] for part in PROJECT_FILES):
            calls.append(HostCall(event["name"], event["tid"], start, end))
    return tuple(sorted(kernels, key=_start)), tuple(sorted(calls, key=_start))


def _start(item: Kernel | HostCall) -> float:
    return item.start_us


def format_profile(profile: KernelProfile, longest: int = 12, gaps: int = 5) -> str:
    if not profile.kernels:
        return f"profile: {profile.wall_s * 1e3:.1f} ms, no GPU kernels recorded (CPU run)"
    busy = sum(k.duration_us for k in profile.kernels)
    idle = sum(gap.duration_us for gap in profile.gaps())
    summary = (
        f"profile: {profile.wall_s * 1e3:.1f} ms under the profiler; {len(profile.kernels)} kernels, "
        f"{busy / 1e3:.1f} ms of kernel time; first-to-last kernel {profile.span_us / 1e3:.1f} ms, "
        f"{idle / 1e3:.1f} ms of it with no kernel running"
    )
    lines = [summary]
    lines += [
        f"  {kind:18} {total / 1e3:9.1f} ms  {total / busy:6.1%}"
        for kind, total in profile.time_by_kind().items()
    ]
    lines.append("  longest kernels:")
    lines += [
        f"    {total / 1e3:8.1f} ms {calls:7d} x {total / calls:8.1f} us  {name[:90]}"
        for name, total, calls in profile.longest(longest)
    ]
    lines.append("  longest gaps:")
    lines += [
        f"    {gap.duration_us / 1e3:8.2f} ms after {gap.after[:50]} | before {gap.before[:50]}"
        for gap in sorted(profile.gaps(), key=lambda gap: -gap.duration_us)[:gaps]
    ]
    if profile.host_calls:
        lines.append(
            f"  idle gaps of {MIN_ATTRIBUTED_GAP_US:.0f} us or more, by the project code running then:"
        )
        lines += [
            f"    {total / 1e3:8.2f} ms  {where[:150]}"
            for where, total in list(profile.idle_by_host_code().items())[:longest]
        ]
    return "\n".join(lines)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
