"""Run records on disk: the files of a run dir are written whole or not at all.

A full disk, or a process killed mid-write, must not leave a record that breaks the next run
(config.yaml, metrics.jsonl, the checkpoints' `latest` pointer). A replaced file is written beside
its destination, flushed, and renamed over it; a log line is appended with one write and taken
back if that write is cut short.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator


def fsync_path(path: Path) -> None:
    """Flush a file's or a directory's entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # a short write (e.g. the disk filled mid-line) is retried and then raises
        view = view[os.write(fd, view) :]


@contextmanager
def replacing(path: Path, text: str) -> Iterator[None]:
    """Write `text` beside `path`, run the block, then rename the new file over `path`.

    If the write or the block fails, `path` is left as it was and the new file is removed.
    """
    staged = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies, as for open()
    try:
        try:
            _write_all(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        yield
        os.replace(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` by a file holding `text`; readers see the old file or the new one, never a part."""
    with replacing(path, text):
        pass


def append_line(path: Path, line: str) -> None:
    """Append `line` (ending in a newline) to `path` in one write and flush it to disk.

    A write that fails part-way (a full disk) is undone: the file is cut back to its earlier
    size, so it never ends in part of a line.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        try:
            _write_all(fd, line.encode())
            os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


MAX_NAME_BYTES = 255  # the longest file name Linux and macOS filesystems take


def file_name_problem(name: str) -> str | None:
    """Why `name` cannot be one file or directory name (a path component), or None if it can."""
    if not name:
        return "it is empty"
    if name in (".", ".."):
        return f"{name!r} names an existing directory, not a new one"
    if "/" in name or "\0" in name:
        return "it holds a '/' or NUL character"
    if len(name.encode()) > MAX_NAME_BYTES:
        return f"it is {len(name.encode())} bytes long, over the {MAX_NAME_BYTES} a file name may have"
    return None


def _can_name_a_file(path: str) -> str:
    """`path`, if it could name a file; else ValueError (empty, a NUL, a part too long to exist)."""
    if not path:
        raise ValueError("a path cannot be empty")
    if "\0" in path:
        raise ValueError("a path cannot hold a NUL character")
    longest = max(len(part.encode()) for part in path.split("/"))
    if longest > MAX_NAME_BYTES:
        raise ValueError(
            f"a part of the path is {longest} bytes long, over the {MAX_NAME_BYTES} a file name may have"
        )
    return path


PathSetting = Annotated[str, AfterValidator(_can_name_a_file)]
"""A config setting that names a file or directory: checked when the config loads, not when first opened."""
