"""A bwrap session's writable dirs on the host: size-limited tmpfs mounts, the jail's disk quota.

Stage: jail set-up and measurement (host side, trusted). The session's /work and /tmp are tmpfs
mounts of their own on the host, bound into every jail of the session. The host still writes the
judge's files there and measures what the program wrote; the program cannot write more than a
mount's size (ENOSPC) or make more files than its inodes, as in a Docker container, whose /work
and /tmp are tmpfs mounts of the same sizes (sandbox.backends.base). The pages are memory,
charged to the cgroup of the process that wrote them: the session's cgroup counts a run's files
with its processes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sandbox.backends.base import SCRATCH_INODES, TMP_TMPFS_MB, WORK_TMPFS_MB, SandboxFailure
from sandbox.backends.tree import file_sizes, remove_tree

MS_NOSUID, MS_NODEV = 0x2, 0x4
MNT_DETACH, UMOUNT_NOFOLLOW = 0x2, 0x8
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
SCRATCH_DIRS = ("work", "tmp")  # a session's mounts, as named under its dir and in the jail


@dataclass(frozen=True)
class ScratchSizes:
    """The tmpfs mounts of a session: its disk quota (a Docker container's, by default)."""

    work_mb: int = WORK_TMPFS_MB
    tmp_mb: int = TMP_TMPFS_MB
    inodes: int = SCRATCH_INODES  # per mount

    def __post_init__(self) -> None:
        for name in ("work_mb", "tmp_mb", "inodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def make_session_dirs(root: Path, uid: int, sizes: ScratchSizes) -> None:
    """The session's /work and /tmp under `root`: tmpfs mounts owned by `uid`, mode 0700."""
    for name, size_mb in zip(SCRATCH_DIRS, (sizes.work_mb, sizes.tmp_mb), strict=True):
        os.mkdir(root / name, 0o700)
        mount_tmpfs(root / name, size_mb, sizes.inodes, uid)


def remove_session_dir(root: Path) -> None:
    """Unmount the session's mounts (those that were made) and remove its dir."""
    for name in SCRATCH_DIRS:
        unmount(root / name)
    remove_tree(root)


def check_tmpfs_mounts(work_root: Path) -> None:
    """Raise SandboxFailure where no tmpfs can be mounted under `work_root`."""
    probe = Path(tempfile.mkdtemp(prefix="mount-check-", dir=work_root))
    try:
        mount_tmpfs(probe, 1, 16, os.geteuid())
        unmount(probe)
    finally:
        os.rmdir(probe)


def mount_tmpfs(path: Path, size_mb: int, inodes: int, uid: int) -> None:
    """Mount a tmpfs of `size_mb` MiB and `inodes` inodes at `path`, a private dir of `uid`."""
    options = f"size={size_mb}m,nr_inodes={inodes},mode=0700,uid={uid},gid={uid}"
    if _libc.mount(b"tmpfs", bytes(path), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()) != 0:
        reason = os.strerror(ctypes.get_errno())
        raise SandboxFailure(
            f"cannot mount the jail's {size_mb} MiB tmpfs at {path} ({reason}): the bwrap backend "
            "needs root with the right to mount (CAP_SYS_ADMIN) for its disk quota"
        )


def unmount(path: Path) -> None:
    """Detach the mount at `path` (its memory goes with the last jail still holding it); no mount is fine."""
    if _libc.umount2(bytes(path), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
        error = ctypes.get_errno()
        if error not in (errno.EINVAL, errno.ENOENT):  # not a mount point, or already gone
            raise OSError(error, os.strerror(error), str(path))


def scratch_full(directories: Iterable[Path], file_limit: int) -> bool:
    """Whether the run filled a mount (space or inodes) or made a file of `file_limit` bytes:
    output it could not write (most runtimes see EFBIG/ENOSPC as an ordinary error)."""
    directories = list(directories)
    for directory in directories:
        usage = os.statvfs(directory)
        if usage.f_bavail == 0 or usage.f_favail == 0:
            return True
    return any(size >= file_limit for directory in directories for size in file_sizes(directory))
