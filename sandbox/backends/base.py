"""The jail contract: run one untrusted process with limits and report what happened.

A backend knows nothing about tests or verdicts. The judge (trusted, on the host) opens a
session, writes the program's files into the session's private work directory, runs the
compiler once and the program once per test, and decides verdicts from `ProcessResult`s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# The jail's writable space, the same on every backend: /work and /tmp are tmpfs mounts of these
# sizes (its disk quota: a write past it fails with ENOSPC, judged OLE). Their pages are memory,
# counted with the run's processes where a memory cgroup holds the run.
WORK_TMPFS_MB = 64
TMP_TMPFS_MB = 64
SCRATCH_INODES = 16384  # files + directories per mount


@dataclass(frozen=True)
class Limits:
    """Resource limits for one process run inside the jail."""

    wall_time_s: float = 10.0  # enforced by the host; the whole jail is killed past it
    cpu_time_s: float = 10.0
    memory_mb: int = 512
    max_output_bytes: int = 1 << 20  # per stream; more is cut off and flagged
    max_processes: int = 64
    max_file_size_mb: int = 16


@dataclass(frozen=True)
class ProcessResult:
    """What one jailed process did, as observed from outside the jail."""

    exit_code: int | None  # None when killed by a signal
    signal: int | None
    stdout: bytes  # at most Limits.max_output_bytes
    stderr: bytes
    wall_time_s: float
    cpu_time_s: float
    timed_out: bool  # killed by the host's wall clock or the CPU limit
    memory_exceeded: bool
    output_exceeded: bool
    suspicious: bool = False  # stray process, write outside the work dir, ...: recycle the jail


class SandboxFailure(Exception):
    """The sandbox itself failed (not the program): reported as SANDBOX_ERROR, retried by clients."""


class JailSession(Protocol):
    """A private work directory (mounted at /work inside the jail) for one request."""

    async def write_files(self, files: dict[str, bytes]) -> None: ...

    async def run(
        self, argv: list[str], stdin: bytes, limits: Limits, judge_process: bool = False
    ) -> ProcessResult:
        """Run argv in the jail. `judge_process`: argv is the trusted judge of a test
        (sandbox/harness.py), which starts the program itself; the backend starts it where no
        process it starts can signal it (as the PID namespace's init, or with its children in
        a PID namespace of their own)."""
        ...

    async def close(self) -> None: ...


class Backend(Protocol):
    """A jail provider: Docker warm pool or bubblewrap."""

    name: str

    async def open_session(self) -> JailSession: ...

    async def close(self) -> None: ...
