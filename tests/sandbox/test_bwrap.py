"""bwrap backend specifics: file writes that cannot be redirected, per-session uids, cleanup, setup
failures, the session's disk quota and host directories no other user can swap."""

from __future__ import annotations

import asyncio
import errno
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandbox.backends.base import SCRATCH_INODES, TMP_TMPFS_MB, WORK_TMPFS_MB, Limits, SandboxFailure
from sandbox.backends.bwrap import BwrapBackend
from sandbox.backends.jail_init import build_jail_init
from sandbox.backends.rlimits import rlimit_argv, rlimits
from sandbox.backends.seccomp_filter import bwrap_filter, namespace_filter
from sandbox.backends.tree import file_sizes
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
        session.root.chmod(0o700)  # the jail uid can no longer reach /work to mount it
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


# Writes 8 MiB files (each below the file size limit) into /work and /tmp until a write fails,
# up to 320 MiB each; prints the errno each directory ended with (or None).
FILL_WORK_AND_TMP = """
import os
errors = []
for directory in ('/work', '/tmp'):
    try:
        for index in range(40):
            with open(f'{directory}/fill{index}', 'wb') as handle:
                for _ in range(8):
                    handle.write(b'x' * (1 << 20))
        errors.append(None)
    except OSError as error:
        errors.append(error.errno)
print(*errors)
"""


async def test_a_session_puts_no_more_than_its_quota_on_the_host(
    backend: BwrapBackend, work_root: Path
) -> None:
    quota = (WORK_TMPFS_MB + TMP_TMPFS_MB) << 20
    disk_before = shutil.disk_usage(work_root).used
    session = await backend.open_session()
    try:
        result = await session.run(
            ["python3", "-c", FILL_WORK_AND_TMP], b"", Limits(wall_time_s=20, cpu_time_s=10, memory_mb=256)
        )
        on_the_host = sum(file_sizes(session.work_dir)) + sum(file_sizes(session.paths.tmp_dir))
        disk_growth = shutil.disk_usage(work_root).used - disk_before
    finally:
        await session.close()
    assert (result.stdout, result.output_exceeded) == (f"{errno.ENOSPC} {errno.ENOSPC}\n".encode(), True)
    assert on_the_host <= quota
    assert disk_growth < quota  # 640 MiB were attempted; tmpfs pages are not on the disk at all


async def test_the_quota_is_the_backends_option(work_root: Path) -> None:
    backend = await BwrapBackend.create(
        uid_base=UID_BASE, num_uids=1, work_root=str(work_root), work_tmpfs_mb=3, tmp_tmpfs_mb=5
    )
    session = await backend.open_session()
    try:
        sizes = [os.statvfs(path) for path in (session.work_dir, session.paths.tmp_dir)]
    finally:
        await session.close()
        await backend.close()
    assert [size.f_blocks * size.f_frsize for size in sizes] == [3 << 20, 5 << 20]
    assert [size.f_files for size in sizes] == [SCRATCH_INODES, SCRATCH_INODES]


STALE_SESSION = """
import asyncio, os, sys
from sandbox.backends.bwrap import BwrapBackend

async def main():
    backend = await BwrapBackend.create(uid_base=int(sys.argv[1]), num_uids=1, work_root=sys.argv[2])
    session = await backend.open_session()
    with open(os.path.join(session.work_dir, "left"), "wb") as file:
        file.write(os.urandom(1 << 20))
    print(session.root, flush=True)
    os.kill(os.getpid(), 9)  # a crash: nothing is closed

asyncio.run(main())
"""


async def test_a_session_left_by_a_killed_process_is_unmounted_when_its_uid_is_next_used(
    work_root: Path,
) -> None:
    killed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", STALE_SESSION, str(UID_BASE), str(work_root)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    stale = Path(killed.stdout.strip())
    assert os.path.ismount(stale / "work")  # the crash left its tmpfs holding 1 MiB of memory
    backend = await BwrapBackend.create(uid_base=UID_BASE, num_uids=1, work_root=str(work_root))
    session = await backend.open_session()
    try:
        assert not stale.exists()
        assert session.root != stale and os.path.ismount(session.root / "work")
    finally:
        await session.close()
        await backend.close()
    assert list((work_root / "sandbox-bwrap").iterdir()) == []


# --- host directories no other user can swap ---------------------------------------------------

NOBODY = 65534


def _squat(path: Path, how: str) -> None:
    """Make `path` as another local user could have, before the sandbox starts."""
    if how == "symlink":
        target = path.parent / "elsewhere"
        target.mkdir(mode=0o711)
        path.symlink_to(target)
        return
    path.mkdir(mode=0o711)
    if how == "other_owner":
        os.chown(path, NOBODY, NOBODY)
    else:  # world-writable, so that any user can swap what is in it
        path.chmod(0o777)


@pytest.mark.parametrize(
    ("how", "problem"),
    [
        ("other_owner", f"is owned by uid {NOBODY}"),
        ("symlink", "is a symlink"),
        ("world_writable", "is writable by group or others"),
    ],
)
async def test_a_squatted_work_root_is_refused_naming_the_path(
    work_root: Path, how: str, problem: str
) -> None:
    squatted = work_root / "sandbox-bwrap"
    _squat(squatted, how)
    with pytest.raises(SandboxFailure, match=f"^{re.escape(str(squatted))} {problem}"):
        await BwrapBackend.create(uid_base=UID_BASE, num_uids=1, work_root=str(work_root))
    assert squatted.lstat().st_uid == (NOBODY if how == "other_owner" else 0)  # left as it was


async def test_a_work_root_in_a_dir_another_user_owns_is_refused(work_root: Path) -> None:
    theirs = work_root / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)  # they could rename our sandbox-bwrap dir and put theirs there
    with pytest.raises(
        SandboxFailure, match=f"^{re.escape(str(theirs))}, a parent of .* is owned by uid {NOBODY}"
    ):
        await BwrapBackend.create(uid_base=UID_BASE, num_uids=1, work_root=str(theirs))


@pytest.mark.parametrize("build", [build_jail_init, bwrap_filter, namespace_filter], ids=lambda f: f.__name__)
def test_a_squatted_cache_of_the_jail_init_and_filters_is_refused(work_root: Path, build) -> None:
    cache = work_root / "cache"
    _squat(cache, "other_owner")
    with pytest.raises(SandboxFailure, match=f"^{re.escape(str(cache))} is owned by uid {NOBODY}"):
        build(cache)
    assert list(cache.iterdir()) == []


def test_a_squatted_uid_lock_dir_is_refused(work_root: Path) -> None:
    locks = work_root / "locks"
    _squat(locks, "other_owner")
    with pytest.raises(SandboxFailure, match=f"^{re.escape(str(locks))} is owned by uid {NOBODY}"):
        UidPool(UID_BASE, 1, locks)
