"""A session on a backend jail: one `JailSession` of the docker or bwrap backend, kept for an episode.

Stage: episode execution. Both backends keep a jail session's /work and /tmp from one run to the
next (a Docker session holds one pooled container; a bwrap session its private tmpfs mounts and
uid) and end every process of a run when it returns, so a session is a sequence of runs of
`bash -c COMMAND` in one jail session. Files cross into and out of the jail through in-jail
commands (`cat > path`, `cat path`), never through host file operations on the jail's dirs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from sandbox.backends.base import JailSession, Limits, ProcessResult, SandboxFailure
from sandbox.sessions.types import ExecResult, FileContent, SessionFailure, SessionLimits

BASH = "/bin/bash"
# $1 is the path; stdin the file's bytes. Parent dirs are made as the jail's uid, inside the jail.
_WRITE = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
_MISSING_EXIT = 3
_READ = f'if [ -f "$1" ]; then exec cat -- "$1"; else echo "no such file: $1" >&2; exit {_MISSING_EXIT}; fi'
# A command may chmod what it made to 000: give the owner its rights back before removing.
_RESET = "chmod -R u+rwx /work /tmp 2>/dev/null; find /work /tmp -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +"
FILE_OP_TIMEOUT_S = 30.0


class JailBackedSession:
    """One episode's jail. Built by `SessionPool`; `close` hands the jail back to its backend."""

    def __init__(
        self,
        session_id: str,
        jail: JailSession,
        limits: SessionLimits,
        expires_at: float,
        on_close: Callable[[JailBackedSession], Awaitable[None]],
    ) -> None:
        self.session_id = session_id
        self.limits = limits
        self.expires_at = expires_at  # time.monotonic(); the pool reaps the session past it
        self.num_commands = 0
        self._jail = jail
        self._on_close = on_close
        self._lock = asyncio.Lock()  # one command at a time: they share the jail's files
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    async def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        if not isinstance(command, str) or not command.strip():
            raise ValueError(f"command must be a non-empty string, got {command!r}")
        timeout = self.limits.timeout_s(timeout_s)
        result = await self._run([BASH, "-c", command], b"", timeout)
        cap = self.limits.max_output_bytes
        return ExecResult(
            exit_code=result.exit_code,
            stdout=result.stdout.decode(errors="replace"),
            stderr=result.stderr.decode(errors="replace"),
            stdout_truncated=result.output_exceeded and len(result.stdout) >= cap,
            stderr_truncated=result.output_exceeded and len(result.stderr) >= cap,
            timed_out=result.timed_out,
            signal=result.signal,
            memory_exceeded=result.memory_exceeded,
            wall_time_s=result.wall_time_s,
        )

    async def write_file(self, path: str, data: bytes) -> None:
        _check_path(path)
        result = await self._run([BASH, "-c", _WRITE, "write", path], bytes(data), FILE_OP_TIMEOUT_S)
        if result.exit_code != 0:
            # The jail refused (a full disk, a directory in the way): the caller's request failed,
            # not the sandbox.
            reason = result.stderr.decode(errors="replace").strip() or f"exit status {result.exit_code}"
            raise OSError(f"cannot write {path!r} in the session: {reason}")

    async def read_file(self, path: str) -> FileContent:
        _check_path(path)
        result = await self._run([BASH, "-c", _READ, "read", path], b"", FILE_OP_TIMEOUT_S)
        if result.exit_code != 0:
            return FileContent(b"", truncated=False, exists=False)
        return FileContent(result.stdout, truncated=result.output_exceeded, exists=True)

    async def reset(self) -> None:
        result = await self._run([BASH, "-c", _RESET], b"", FILE_OP_TIMEOUT_S)
        if result.exit_code != 0:
            raise SessionFailure(
                f"could not empty the session: {result.stderr.decode(errors='replace')[:300]}"
            )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._jail.close()
        finally:
            await self._on_close(self)

    async def _run(self, argv: list[str], stdin: bytes, timeout_s: float) -> ProcessResult:
        limits = Limits(
            wall_time_s=timeout_s,
            cpu_time_s=timeout_s,
            memory_mb=self.limits.memory_mb,
            max_output_bytes=self.limits.max_output_bytes,
            max_processes=self.limits.max_processes,
            max_file_size_mb=self.limits.max_file_size_mb,
        )
        async with self._lock:
            self._check_open()
            self.num_commands += 1
            try:
                return await self._jail.run(argv, stdin, limits)
            except SessionFailure:
                raise
            except SandboxFailure as error:
                raise SessionFailure(f"session {self.session_id}: {error}") from error

    def _check_open(self) -> None:
        if self._closed:
            raise SessionFailure(f"session {self.session_id} is closed")
        if time.monotonic() > self.expires_at:
            raise SessionFailure(f"session {self.session_id} outlived its time-to-live")


def _check_path(path: str) -> None:
    if not isinstance(path, str) or not path or "\0" in path:
        raise ValueError(f"path must be a non-empty string without NUL bytes, got {path!r}")
