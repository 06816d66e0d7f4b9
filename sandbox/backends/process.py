"""Watching one jailed process from the host: feed stdin, cap output while reading, enforce the wall clock.

Shared by the process-based backends (bwrap, unsafe-local). The process must lead its own
process group (start_new_session) so that killing the group kills the jail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable

from sandbox.backends.base import Limits, ProcessResult, SandboxFailure
from sandbox.backends.cgroups import CgroupRun

CHUNK_BYTES = 1 << 16
EXIT_GRACE_S = 10.0  # after a kill, the jail's pipes must close within this
REPORT_GRACE_S = 1.0  # after killing the jail's PID namespace, its supervisor reports and exits within this


class _CappedReader:
    """Reads a stream to its end, keeping at most `cap` bytes; calls `on_exceeded` once past it."""

    def __init__(self, stream: asyncio.StreamReader, cap: int, on_exceeded) -> None:
        self.data = bytearray()
        self.exceeded = False
        self._stream, self._cap, self._on_exceeded = stream, cap, on_exceeded

    async def read(self) -> None:
        while chunk := await self._stream.read(CHUNK_BYTES):
            room = self._cap - len(self.data)
            self.data += chunk[:room]
            if len(chunk) > room and not self.exceeded:
                self.exceeded = True
                self._on_exceeded()


async def _feed(stream: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stream.write(data)
        await stream.drain()
    stream.close()


def kill_group(process: asyncio.subprocess.Process, cgroup: CgroupRun | None) -> None:
    if process.returncode is None:  # once reaped, its pid (and group id) may belong to someone else
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    if cgroup is not None:
        cgroup.kill()


async def _await_exit(
    work: asyncio.Future, process: asyncio.subprocess.Process, cgroup: CgroupRun | None, backstop: bool
) -> None:
    if backstop:
        try:
            await asyncio.wait_for(asyncio.shield(work), timeout=REPORT_GRACE_S)
            return
        except TimeoutError:
            kill_group(process, cgroup)
    try:
        await asyncio.wait_for(work, timeout=EXIT_GRACE_S)
    except TimeoutError as error:
        raise SandboxFailure(f"the jail did not die within {EXIT_GRACE_S}s of SIGKILL") from error


def exit_status(returncode: int) -> tuple[int | None, int | None]:
    """(exit code, signal): negative codes are signals; bwrap reports a signalled child as 128 + signal."""
    if returncode < 0:
        return None, -returncode
    if 128 < returncode <= 128 + 64:
        return None, returncode - 128
    return returncode, None


async def collect_process(
    process: asyncio.subprocess.Process,
    stdin: bytes,
    limits: Limits,
    cgroup: CgroupRun | None,
    kill_jail: Callable[[], bool] | None = None,
    started: float | None = None,
) -> ProcessResult:
    """Run `process` to its end or its wall clock and report what it did.

    `started` (time.monotonic()) is when the run began, if before this call (e.g. before spawning).

    `kill_jail`, when given, kills the jail's PID namespace (everything the program started) and
    says whether it could; the process itself then exits on its own, reporting how the jail ended.
    Killing the whole process group and cgroup is the backstop.
    """
    started = time.monotonic() if started is None else started
    assert process.stdin and process.stdout and process.stderr

    def stop() -> None:
        if kill_jail is None or not kill_jail():
            kill_group(process, cgroup)

    stdout = _CappedReader(process.stdout, limits.max_output_bytes, stop)
    stderr = _CappedReader(process.stderr, limits.max_output_bytes, stop)
    work = asyncio.gather(_feed(process.stdin, stdin), stdout.read(), stderr.read(), process.wait())
    host_killed = False
    try:
        await asyncio.wait_for(asyncio.shield(work), timeout=limits.wall_time_s)
    except TimeoutError:
        host_killed = True
        stop()
        await _await_exit(work, process, cgroup, backstop=kill_jail is not None)
    wall_time_s = time.monotonic() - started
    exit_code, signal_number = exit_status(process.returncode)
    cpu_time_s = cgroup.cpu_time_s() if cgroup is not None else 0.0
    cpu_exhausted = signal_number == signal.SIGXCPU or (
        signal_number == signal.SIGKILL and cpu_time_s >= limits.cpu_time_s
    )
    output_exceeded = stdout.exceeded or stderr.exceeded
    return ProcessResult(
        exit_code=exit_code,
        signal=signal_number,
        stdout=bytes(stdout.data),
        stderr=bytes(stderr.data),
        wall_time_s=wall_time_s,
        cpu_time_s=cpu_time_s,
        timed_out=(host_killed and not output_exceeded) or cpu_exhausted,
        memory_exceeded=cgroup.memory_exceeded() if cgroup is not None else False,
        output_exceeded=output_exceeded,
    )
