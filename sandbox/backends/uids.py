"""A pool of host uids for jails: one uid per open session, exclusive across processes.

A uid of its own per session is what makes RLIMIT_NPROC a per-jail limit (the kernel counts
processes per uid) and keeps concurrent sessions out of each other's files. Exclusivity across
processes of the host (several servers, tests) comes from an flock per uid.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

from sandbox.backends.private_dirs import private_directory


class UidPool:
    """Uids `base .. base + size - 1`, handed out one per session."""

    def __init__(self, base: int, size: int, lock_dir: Path, poll_s: float = 0.02) -> None:
        if base < 1000 or size < 1:
            raise ValueError(
                f"uid range must be non-system uids (base >= 1000, size >= 1), got {base}+{size}"
            )
        self.base, self.size = base, size
        self._lock_dir = private_directory(lock_dir, 0o700)  # nobody else may hold or remove our locks
        self._held: dict[int, int] = {}  # uid -> locked fd
        self._poll_s = poll_s
        self._next = base

    @property
    def uids(self) -> range:
        return range(self.base, self.base + self.size)

    def try_acquire(self) -> int | None:
        # Round robin, not lowest-free: the kernel releases a finished jail's per-uid process count
        # lazily, so handing the same uid straight back out makes RLIMIT_NPROC refuse the next fork.
        start = self._next - self.base
        for offset in range(self.size):
            uid = self.base + (start + offset) % self.size
            if uid in self._held:
                continue
            fd = os.open(self._lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._held[uid] = fd
            self._next = uid + 1
            return uid
        return None

    async def acquire(self) -> int:
        """A free uid, waiting while every uid is in use."""
        while (uid := self.try_acquire()) is None:
            await asyncio.sleep(self._poll_s)
        return uid

    def release(self, uid: int) -> None:
        fd = self._held.pop(uid)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
