"""Stateful sandbox sessions: the values and the protocol every session implementation shares.

Stage: episode execution (terminal tasks). A session is one jail that lives for one episode:
its files in /work (the working directory and HOME) and /tmp persist from one command to the
next, while every process a command starts is killed when the command returns. Untrusted
commands run only inside the jail; the host never reads or writes the jail's files itself
(`write_file` and `read_file` are in-jail commands too), so no link a command plants can
redirect the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sandbox.backends.base import SandboxFailure

WORK_DIR = "/work"  # a session's working directory and HOME, on every backend


class SessionFailure(SandboxFailure):
    """The session's sandbox failed or the session is gone (closed, expired): never the command's doing."""


@dataclass(frozen=True)
class SessionLimits:
    """What one session may use; each command runs under these limits.

    Disk is the size of the session's /work and /tmp (tmpfs mounts of `disk_mb` each, whose
    pages count as the session's memory). `cpus` caps the share of the machine's cores a
    Docker session gets; bwrap sessions are bounded by CPU time per command instead.
    """

    memory_mb: int = 512  # every process of a command and the session's files together
    max_processes: int = 64  # per command
    disk_mb: int = 64  # each of /work and /tmp
    max_output_bytes: int = 64 << 10  # per stream per command; more is cut off (and the command killed)
    max_file_size_mb: int = 16
    cpus: float = 1.0  # Docker only
    default_timeout_s: float = 10.0  # a command's wall clock (and CPU time) when exec gets none
    max_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("memory_mb", "max_processes", "disk_mb", "max_output_bytes", "max_file_size_mb"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"SessionLimits.{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.memory_mb < 32:
            raise ValueError(f"SessionLimits.memory_mb must be >= 32, got {self.memory_mb}")
        for name in ("cpus", "default_timeout_s", "max_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SessionLimits.{name} must be > 0, got {getattr(self, name)!r}")
        if self.default_timeout_s > self.max_timeout_s:
            raise ValueError(
                f"SessionLimits.default_timeout_s ({self.default_timeout_s}) must be <= max_timeout_s "
                f"({self.max_timeout_s})"
            )

    def timeout_s(self, requested: float | None) -> float:
        """A command's wall clock: `requested` (checked against the cap) or the default."""
        if requested is None:
            return self.default_timeout_s
        if not 0 < requested <= self.max_timeout_s:
            raise ValueError(f"timeout must be in (0, {self.max_timeout_s:g}] seconds, got {requested!r}")
        return float(requested)


@dataclass(frozen=True)
class ExecResult:
    """What one command did, observed from outside the jail."""

    exit_code: int | None  # None when a signal ended it (then `signal` says which)
    stdout: str  # decoded with errors="replace", at most SessionLimits.max_output_bytes
    stderr: str
    stdout_truncated: bool  # the stream hit its cap: the rest was cut off and the command killed
    stderr_truncated: bool
    timed_out: bool  # killed at its wall clock or CPU limit
    signal: int | None = None
    memory_exceeded: bool = False
    wall_time_s: float = 0.0


@dataclass(frozen=True)
class FileContent:
    """A file read out of a session."""

    data: bytes  # at most the session's max_output_bytes
    truncated: bool
    exists: bool = True


class Session(Protocol):
    """One long-lived jail for one episode; local (`sandbox.sessions.jail`) or remote (`.remote`)."""

    session_id: str

    async def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        """Run `command` with bash -c in the working directory; the session's files persist."""
        ...

    async def write_file(self, path: str, data: bytes) -> None:
        """Write `data` to `path` (absolute, or relative to /work), making its parent dirs."""
        ...

    async def read_file(self, path: str) -> FileContent: ...

    async def reset(self) -> None:
        """Empty /work and /tmp: the session as it started."""
        ...

    async def close(self) -> None:
        """Kill what runs and give the jail back; closing twice is fine."""
        ...
