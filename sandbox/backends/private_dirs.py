"""Host directories the sandbox keeps in a shared place such as /tmp: ours and private, or refused.

Stage: backend start-up (host side, trusted). A directory under a world-writable /tmp can be
made first by any local user. If the sandbox then used it, that user could rename or replace
what the sandbox puts there: a session's program or judge files, the jail's init binary, its
seccomp filter, the uid locks. So a directory is used only when it is a real directory (not a
symlink) owned by this process's uid, not writable by group or others, and below parents that
no other user can rename it in (owned by root or by us, and sticky where others may write,
as /tmp is). Anything else is refused with an error naming the path.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from sandbox.backends.base import SandboxFailure

OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
# Root-owned cache of what is built once per host: the jail init binary, the BPF filters.
CACHE_DIR_NAME = "sandbox-bwrap-init"


def _problem(info: os.stat_result, trusted_uids: tuple[int, ...]) -> str | None:
    """Why a directory with this lstat could be changed by another user, or None."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid not in trusted_uids:
        return f"is owned by uid {info.st_uid}, not by this process's uid {os.geteuid()}"
    return None


def private_directory(path: Path, mode: int) -> Path:
    """Make `path` (mode `mode`, parents must exist) or take it as it is if it is already ours.

    Raises SandboxFailure naming the path when it, or one of its parents, could be changed by
    another user: the fix is to remove what is there or to choose another directory.
    """
    path = path.absolute().parent.resolve() / path.name  # the parents as they really are
    trusted = (os.geteuid(), 0)
    for parent in reversed(path.parents):
        info = os.lstat(parent)
        problem = _problem(info, trusted)
        if problem is None and info.st_mode & OTHERS_WRITE and not info.st_mode & stat.S_ISVTX:
            problem = (
                f"is writable by group or others without the sticky bit (mode {info.st_mode & 0o7777:o})"
            )
        if problem is not None:
            raise SandboxFailure(
                f"{parent}, a parent of {path}, {problem}: another user could swap {path}; "
                "choose a directory below parents only root or this uid can change"
            )
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    info = os.lstat(path)
    problem = _problem(info, (os.geteuid(),))
    if problem is None and info.st_mode & OTHERS_WRITE:
        problem = f"is writable by group or others (mode {info.st_mode & 0o7777:o})"
    if problem is not None:
        raise SandboxFailure(
            f"{path} {problem}: another user may have made it to swap what the sandbox keeps there; "
            "remove it or choose another directory"
        )
    os.chmod(path, mode)  # a real directory of ours below safe parents: nobody can swap it meanwhile
    return path


def cache_directory(cache_root: Path | None = None) -> Path:
    """The host's build cache (the jail init, the seccomp filters): `cache_root` or a dir in /tmp."""
    return private_directory(cache_root or Path(tempfile.gettempdir()) / CACHE_DIR_NAME, 0o755)
