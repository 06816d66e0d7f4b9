"""Fixtures shared by the sandbox tests: the backend matrix and a jail-leftover inspector."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from sandbox.executor import Executor

# A uid range of our own, so that "no process of the jail uid is left" is exact even while
# other sandbox tests on this machine use the default range.
TEST_UID_BASE = 62000
TEST_NUM_UIDS = 8
DAEMON_TAG = "sandbox-redteam-daemon"  # red-team programs put this in their helpers' argv


@pytest.fixture(scope="module", params=["bwrap", "docker"])
def backend_name(request: pytest.FixtureRequest) -> str:
    """Every red-team case runs on each real backend; a missing Docker engine fails, never skips."""
    return request.param


@pytest.fixture(scope="module")
def jail_root() -> Iterator[Path]:
    """Where bwrap sessions live: under /tmp itself, because jail uids must traverse its parents."""
    root = Path(tempfile.mkdtemp(prefix="sandbox-test-jails-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def executor(backend_name: str, jail_root: Path) -> AsyncIterator[Executor]:
    options = {}
    if backend_name == "bwrap":
        options = {"uid_base": TEST_UID_BASE, "num_uids": TEST_NUM_UIDS, "work_root": str(jail_root)}
    async with await Executor.create(backend_name, max_concurrency=2, **options) as executor:
        yield executor


def processes_matching(uids: range, tag: str) -> list[str]:
    """Host processes (any namespace) owned by a uid in `uids` or carrying `tag` in their argv."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            owner = entry.stat().st_uid
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if owner in uids or tag in command:
            found.append(f"{entry.name} uid={owner} {command[:80]}")
    return found
