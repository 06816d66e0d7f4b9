"""A bwrap session command whose caller is cancelled at any step of its start: the jail dies, the caller leaves.

The jail outlives the process the host spawned when bwrap's supervisor is killed between its
clone and its child's --die-with-parent. That window is too narrow to hit on purpose, so bwrap
runs here as the child of a shell: killing the spawned process (the shell) alone leaves the
real bwrap and its jail running, holding the run's pipes, exactly as in that window. The
caller is cancelled after 0, 1, 2, ... turns of the event loop, which puts the cancellation at
each await of the command's start in turn (the spawn, the pipes' connection, the first reads);
the exact point of the spawn (bwrap started, its pipes not yet connected) is reached through a
`Popen` that cancels the caller as it returns.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from sandbox.backends.bwrap import BwrapBackend
from sandbox.sessions import SessionPool, SessionPoolSettings, leftovers

pytestmark = pytest.mark.asyncio
SESSION_UID_BASE = 63480  # apart from the other session tests' uids
# Cancellation lands on the first turns (the spawn and its pipes) and then spreads to later ones.
LOOP_TURNS_BEFORE_CANCEL = (0, 1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 64, 128, 256, 1024)
LEAVE_DEADLINE_S = 20.0  # a caller that is not gone by then hangs (the clean-up's own bound is 10 s)


@pytest.fixture
def work_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="session-cancel-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root)


@pytest.fixture
def bwrap_behind_a_shell(work_root: Path) -> Path:
    """A `bwrap` that runs the real one as its child (no exec), so that killing it leaves the jail."""
    real = shutil.which("bwrap")
    assert real is not None, "bubblewrap is not installed: apt-get install -y bubblewrap"
    shim_dir = work_root / "bin"
    shim_dir.mkdir(mode=0o755)
    shim = shim_dir / "bwrap"
    shim.write_text(f'#!/bin/sh\n"{real}" "$@"\nexit $?\n')  # the trailing exit keeps sh from exec-ing
    shim.chmod(0o755)
    return shim


@pytest_asyncio.fixture
async def pool(work_root: Path) -> AsyncIterator[SessionPool]:
    settings = SessionPoolSettings(
        backend="bwrap", num_warm=0, max_sessions=1, uid_base=SESSION_UID_BASE, work_root=str(work_root)
    )
    async with await SessionPool.create(settings) as pool:
        yield pool


def live_processes(pool: SessionPool) -> list[int]:
    """The session uids' processes that still run, once the killed ones had a moment to die.

    A process SIGKILLed a moment ago may still be exiting; a zombie is dead (the host's init reaps it).
    """
    assert isinstance(pool.backend, BwrapBackend)
    deadline = time.monotonic() + 5.0
    while True:
        found = [
            pid
            for uid in pool.backend.uids.uids
            for pid in leftovers.processes_of_uid(uid)
            if _state(pid) not in ("Z", None)
        ]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def wait_for_a_child(pid: int) -> None:
    """Block (the event loop too, on purpose) until process `pid` has started a child."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    deadline = time.monotonic() + 10.0
    while not children.read_text().strip():
        assert time.monotonic() < deadline, f"process {pid} started no child"
        time.sleep(0.001)


async def test_a_write_cancelled_as_its_jail_starts_kills_the_jail_and_the_caller_leaves(
    pool: SessionPool, bwrap_behind_a_shell: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(pool.backend, BwrapBackend)
    session = await pool.acquire()
    write: asyncio.Task[None] | None = None

    class PopenThenCancel(subprocess.Popen):
        """The caller's cancellation at the exact point of the spawn: bwrap runs, its pipes are not yet connected."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            wait_for_a_child(self.pid)  # the real bwrap has started: killing the shell alone leaves it
            assert write is not None
            write.cancel()

    try:
        pool.backend.bwrap = str(bwrap_behind_a_shell)
        monkeypatch.setattr(subprocess, "Popen", PopenThenCancel)
        # `cat` waits for the end of its stdin: a jail left running keeps the run's pipes open for
        # as long as the host holds stdin.
        write = asyncio.create_task(session.write_file("state.txt", b"episode 1\n"))
        done, _ = await asyncio.wait({write}, timeout=LEAVE_DEADLINE_S)
        monkeypatch.undo()
        assert write in done, "the cancelled write did not return"
        assert write.cancelled()
        assert live_processes(pool) == []
        result = await session.exec("echo still usable")  # the session outlives its cancelled command
        assert (result.exit_code, result.stdout) == (0, "still usable\n")
    finally:
        await session.close()


async def test_a_write_cancelled_at_each_later_step_kills_the_jail_and_the_caller_leaves(
    pool: SessionPool, bwrap_behind_a_shell: Path
) -> None:
    assert isinstance(pool.backend, BwrapBackend)
    session = await pool.acquire()
    try:
        pool.backend.bwrap = str(bwrap_behind_a_shell)
        outcomes = []
        for num_turns in LOOP_TURNS_BEFORE_CANCEL:
            write = asyncio.create_task(session.write_file("state.txt", b"episode 1\n"))
            for _ in range(num_turns):
                await asyncio.sleep(0)
            write.cancel()
            done, _ = await asyncio.wait({write}, timeout=LEAVE_DEADLINE_S)
            assert write in done, f"cancelled after {num_turns} loop turns, the write did not return"
            outcomes.append("cancelled" if write.cancelled() else "finished")
            if not write.cancelled():
                write.result()  # a write that finished before the cancellation must have succeeded
            assert live_processes(pool) == [], f"cancelled after {num_turns} loop turns"
        assert outcomes[:3] == ["cancelled"] * 3  # the first turns are the spawn itself
        result = await session.exec("echo still usable")
        assert (result.exit_code, result.stdout) == (0, "still usable\n")
    finally:
        await session.close()
