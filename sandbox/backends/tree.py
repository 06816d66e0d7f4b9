"""Removing a directory tree that a jailed program built: iteratively, through directory fds, bounded.

A program controls the shape of its work dir. Recursive removal (shutil.rmtree) overflows
Python's stack on a tree a few thousand levels deep, and path-based removal fails past PATH_MAX,
so this walks down and back up through directory file descriptors, holding one at a time, and
keeps only a list of pending names per level. The jail is dead while this runs (nothing can
swap a directory for a link meanwhile) and every step refuses to follow links.

The same algorithm lives, standard library only, in the in-container runner
(sandbox/image/runner.py), which cannot import this package.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_ENTRIES = 1_000_000  # far more than a run can make within its limits; beyond it we give up


class TreeTooLarge(OSError):
    """The tree has more entries than the removal is allowed to visit."""


Files = list[tuple[str, int]]  # (name, size) of the non-directories in one directory


def _entries(directory_fd: int) -> tuple[list[str], Files]:
    """(subdirectory names, files) of one directory; nothing is followed."""
    subdirectories, files = [], []
    with os.scandir(directory_fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subdirectories.append(entry.name)
            else:
                files.append((entry.name, entry.stat(follow_symlinks=False).st_size))
    return subdirectories, files


def walk(
    path: str | os.PathLike[str],
    on_files: Callable[[int, Files], None],
    on_leave: Callable[[int, str], None] | None = None,
    max_entries: int = MAX_ENTRIES,
    make_accessible: bool = False,
) -> None:
    """Visit every directory under `path` (itself included), depth first, without recursion.

    `on_files(directory_fd, files)` per directory; `on_leave(parent_fd, name)` after all of a
    subdirectory was visited (removal goes there). `make_accessible` chmods each directory to
    0700 before entering it, for a cleaner that is not root.
    """
    fd = os.open(path, DIRECTORY_FLAGS)
    names: list[str] = []  # the path from `path` down to where fd is
    pending: list[list[str]] = []  # per level: subdirectories not yet visited
    visited = 0
    try:
        subdirectories, files = _entries(fd)
        on_files(fd, files)
        pending.append(subdirectories)
        visited += len(subdirectories) + len(files)
        while True:
            if visited > max_entries:
                raise TreeTooLarge(f"{path} holds more than {max_entries} entries")
            if pending[-1]:
                name = pending[-1].pop()
                if make_accessible:
                    os.chmod(name, stat.S_IRWXU, dir_fd=fd)  # a program may have made it unreadable
                child = os.open(name, DIRECTORY_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
                names.append(name)
                subdirectories, files = _entries(fd)
                on_files(fd, files)
                pending.append(subdirectories)
                visited += len(subdirectories) + len(files)
                continue
            pending.pop()
            if not names:
                return
            parent = os.open("..", DIRECTORY_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            name = names.pop()
            if on_leave is not None:
                on_leave(fd, name)
    finally:
        os.close(fd)


def file_sizes(path: str | os.PathLike[str], max_entries: int = MAX_ENTRIES) -> list[int]:
    """Sizes of every non-directory under `path`."""
    sizes: list[int] = []
    walk(path, lambda _, files: sizes.extend(size for _, size in files), max_entries=max_entries)
    return sizes


def empty_directory(path: str | os.PathLike[str], max_entries: int = MAX_ENTRIES) -> None:
    """Remove everything inside `path` (not `path` itself)."""

    def unlink_files(directory_fd: int, files: Files) -> None:
        for name, _ in files:
            os.unlink(name, dir_fd=directory_fd)

    def remove_directory(parent_fd: int, name: str) -> None:
        os.rmdir(name, dir_fd=parent_fd)

    walk(path, unlink_files, remove_directory, max_entries, make_accessible=True)


def remove_tree(path: str | os.PathLike[str], max_entries: int = MAX_ENTRIES) -> None:
    """Remove `path`: a file or link itself (never what a link points to), or a whole directory tree."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        os.unlink(path)
        return
    os.chmod(path, stat.S_IRWXU)
    empty_directory(path, max_entries)
    os.rmdir(path)
