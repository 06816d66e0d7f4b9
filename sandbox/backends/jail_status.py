"""The two status pipes of a bubblewrap jail: bwrap's own JSON reports and our init's wait status.

Together they tell a program that ran (and how it ended) from a jail that never started (our
failure) or one the host killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal


class StatusPipe:
    """A pipe whose write end goes to the jail and whose read end the host reads without blocking."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)

    def close_write(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def close(self) -> None:
        self.close_write()
        os.close(self.read_fd)


class JailStatus(StatusPipe):
    """bwrap's status pipe: the PID namespace's init, and the program's exit code once it was executed.

    bwrap writes the exit code only if it executed the program, so its absence proves that the
    program never ran and that whatever failed (and is on stderr) was bwrap's setup. The program
    cannot write here: bwrap closes the pipe in the jail.
    """

    def __init__(self) -> None:
        super().__init__()
        self._data = bytearray()

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self.read_fd, 4096):
                self._data += chunk

    def _field(self, name: str) -> int | None:
        self.drain()
        for line in bytes(self._data).splitlines():
            with contextlib.suppress(ValueError):
                report = json.loads(line)
                if isinstance(report, dict) and isinstance(report.get(name), int):
                    return report[name]
        return None

    @property
    def exit_code(self) -> int | None:
        return self._field("exit-code")

    def kill_namespace(self, supervisor_pid: int) -> bool:
        """SIGKILL the jail's PID namespace init (the kernel then kills all of the namespace).

        bwrap's supervisor outlives it and reports the exit code, so the run still proves that
        its jail was set up. The init is checked to be the supervisor's child through a pidfd,
        so a recycled pid is never signalled.
        """
        pid = self._field("child-pid")
        if pid is None:
            return False
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return False
        try:
            with open(f"/proc/{pid}/stat") as stat:
                parent = int(stat.read().rpartition(")")[2].split()[1])
            if parent != supervisor_pid:
                return False
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            return True
        except (OSError, ValueError, IndexError):
            return False
        finally:
            os.close(pidfd)


class InitStatus(StatusPipe):
    """The pipe on which our jail init reports the program's raw wait status (see jail_init.py)."""

    def wait_status(self) -> int | None:
        """The status, once the jail is over; None if the init never reported (it was killed)."""
        try:
            text = os.read(self.read_fd, 64)
        except BlockingIOError:
            return None
        try:
            return int(text)
        except ValueError:
            return None
