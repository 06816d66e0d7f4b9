"""bwrap backend specifics: file writes that cannot be redirected, per-session uids, cleanup, setup failures."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandbox.backends.base import Limits, SandboxFailure
from sandbox.backends.bwrap import BwrapBackend
from sandbox.backends.rlimits import rlimit_argv, rlimits
from sandbox.backends.uids import UidPool
from sandbox.executor import Executor
from sandbox.types import Language, RunLimits, RunRequest, Verdict

UID_BASE = 62100  # apart from the red-team range so the two suites never share a uid
LIMITS = Limits(wall_time_s=5, cpu_time_s=2, memory_mb=256)


@pytest.fixture
def work_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="sandbox-test-bwrap-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root)


@pytest.fixture
async def backend(work_root: Path) -> AsyncIterator[BwrapBackend]:
    backend = await BwrapBackend.create(uid_base=UID_BASE, num_uids=4, work_root=str(work_root))
    yield backend
    await backend.close()


async def test_a_planted_symlink_is_replaced_not_followed(backend: BwrapBackend, tmp_path: Path) -> None:
    outside = tmp_path / "host_file.txt"
    outside.write_text("host data")
    session = await backend.open_session()
    try:
        result = await session.run(["ln", "-s", str(outside), "/work/main.py"], b"", LIMITS)
        assert result.exit_code == 0
        await session.write_files({"main.py": b"print('program')"})
        assert not (session.work_dir / "main.py").is_symlink()
        assert (session.work_dir / "main.py").stat().st_uid == session.uid
    finally:
        await session.close()
    assert outside.read_text() == "host data"


async def test_file_names_must_stay_inside_the_work_dir(backend: BwrapBackend) -> None:
    session = await backend.open_session()
    try:
        for name in ["../escape.py", "/etc/passwd", "..", ""]:
            with pytest.raises(ValueError, match="must be a plain name"):
                await session.write_files({name: b"x"})
    finally:
        await session.close()


async def test_sessions_get_distinct_uids_and_clean_up_on_close(backend: BwrapBackend) -> None:
    first, second = await backend.open_session(), await backend.open_session()
    assert first.uid != second.uid
    assert {first.uid, second.uid} <= set(range(UID_BASE, UID_BASE + 4))
    result = await first.run(["id", "-u"], b"", LIMITS)
    assert result.stdout == f"{first.uid}\n".encode()
    work_dirs = [first.work_dir, second.work_dir]
    await first.close()
    await second.close()
    assert [path.exists() for path in work_dirs] == [False, False]
    later = [await backend.open_session() for _ in range(3)]
    assert [session.uid for session in later] == [UID_BASE + 2, UID_BASE + 3, UID_BASE]  # round robin
    for session in later:
        await session.close()


def test_two_uid_pools_on_one_lock_dir_never_share_a_uid(tmp_path: Path) -> None:
    pool_a, pool_b = UidPool(63000, 2, tmp_path), UidPool(63000, 2, tmp_path)
    assert [pool_a.try_acquire(), pool_b.try_acquire(), pool_b.try_acquire()] == [63000, 63001, None]
    pool_a.release(63000)
    assert pool_b.try_acquire() == 63000  # released by the other pool, so free again


async def test_a_work_root_the_jail_cannot_traverse_is_rejected(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(ValueError, match="jail uids cannot traverse"):
        await BwrapBackend.create(work_root=str(private / "jails"))


async def test_a_jail_that_cannot_be_set_up_is_a_sandbox_failure(backend: BwrapBackend) -> None:
    session = await backend.open_session()
    try:
        os.rmdir(session.work_dir)  # nothing left to mount at /work
        with pytest.raises(SandboxFailure, match="bwrap could not set up the jail"):
            await session.run(["true"], b"", LIMITS)
    finally:
        await session.close()


async def test_a_program_imitating_a_bwrap_failure_gets_a_program_verdict(backend: BwrapBackend) -> None:
    code = "import sys\nsys.stderr.write('bwrap: Can\\'t mount proc\\n')\nsys.exit(1)"
    request = RunRequest(language=Language.PYTHON, code=code, limits=RunLimits(time_s=2))
    response = await Executor(backend).run(request)
    assert (response.verdict, response.run.stderr) == (Verdict.RE, "bwrap: Can't mount proc\n")


async def test_a_program_that_cannot_be_executed_is_the_programs_failure(backend: BwrapBackend) -> None:
    session = await backend.open_session()
    try:
        result = await session.run(["/work/missing"], b"", LIMITS)
    finally:
        await session.close()
    assert (result.exit_code, result.signal) == (127, None)
    assert result.stderr == b"cannot execute /work/missing: No such file or directory\n"


async def test_a_jail_past_its_wall_clock_is_killed_and_still_reported_by_bwrap(
    backend: BwrapBackend,
) -> None:
    session = await backend.open_session()
    try:
        result = await session.run(["sleep", "100"], b"", Limits(wall_time_s=0.5, cpu_time_s=2))
    finally:
        await session.close()
    assert (result.timed_out, result.exit_code, result.signal) == (True, None, signal.SIGKILL)


def test_rlimits_and_their_prlimit_form_agree() -> None:
    limits = Limits(cpu_time_s=1.5, memory_mb=256, max_file_size_mb=16)
    assert rlimits(limits, 68)[resource.RLIMIT_CPU] == (2, 3)
    assert rlimit_argv(limits, 68) == [
        "prlimit", "--cpu=2:3", f"--as={256 << 20}:{256 << 20}", f"--fsize={16 << 20}:{16 << 20}",
        "--nproc=68:68", "--nofile=256:256", "--core=0:0", "--",
    ]  # fmt: skip
