"""A process killed after its bwrap session's dir was made but before the pool wrote its marker: the next start removes the dir."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.backends.scratch import remove_session_dir
from sandbox.sessions import SessionPool, SessionPoolSettings

pytestmark = pytest.mark.asyncio
SESSION_UID_BASE = 63490  # apart from the other session tests' uids
REPOSITORY = Path(__file__).parents[2]

# The backend's half of a session start, without the pool's marker: where a kill between the two lands.
OPEN_A_SESSION_AND_WAIT = textwrap.dedent(
    """
    import asyncio, sys, time
    from sandbox.backends.bwrap import BwrapBackend

    async def main():
        backend = await BwrapBackend.create(uid_base={uid_base}, num_uids=1, work_root=sys.argv[1])
        await backend.open_session()
        print("OPEN", flush=True)
        time.sleep(600)

    asyncio.run(main())
    """
)


@pytest.fixture
def work_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="session-leftovers-"))
    root.chmod(0o711)
    yield root
    for left in (root / "sandbox-bwrap").glob("session-*"):  # a failed check leaves its tmpfs mounts
        remove_session_dir(left)
    shutil.rmtree(root)


def kill_a_process_that_opened_a_session(work_root: Path) -> None:
    opener = subprocess.Popen(
        [sys.executable, "-c", OPEN_A_SESSION_AND_WAIT.format(uid_base=SESSION_UID_BASE), str(work_root)],
        stdout=subprocess.PIPE, text=True, cwd=REPOSITORY,
    )  # fmt: skip
    try:
        assert opener.stdout is not None and opener.stdout.readline() == "OPEN\n"
    finally:
        opener.kill()
        opener.wait()


async def test_a_session_dir_without_a_marker_left_by_a_killed_process_is_removed_at_the_next_start(
    work_root: Path,
) -> None:
    kill_a_process_that_opened_a_session(work_root)
    left = sorted((work_root / "sandbox-bwrap").glob("session-*"))
    assert [path.name.split("-")[1] for path in left] == [str(SESSION_UID_BASE)]

    settings = SessionPoolSettings(
        backend="bwrap", num_warm=0, max_sessions=1, uid_base=SESSION_UID_BASE, work_root=str(work_root)
    )
    pool = await SessionPool.create(settings)
    await pool.close()
    assert sorted((work_root / "sandbox-bwrap").glob("session-*")) == []
