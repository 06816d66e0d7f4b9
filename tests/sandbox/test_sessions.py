"""Stateful sessions on both backends: files persist, processes do not, and nothing crosses a session."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest
import pytest_asyncio

from sandbox.sessions import SessionFailure, SessionLimits, SessionPool, SessionPoolSettings

pytestmark = pytest.mark.asyncio(loop_scope="module")
# Apart from the other sandbox tests' uids; pools open at once get ranges of their own, since a
# pool's bwrap sessions wait for a uid of its range that no other pool holds.
SESSION_UID_BASE = 63400
# Everywhere a jail could see files of the host or of another session (not /usr: read-only system files).
DATA_DIRS = "/work /tmp /dev/shm /home /root /etc /var /run /srv /opt /mnt /media"


@pytest.fixture(scope="module", params=["bwrap", "docker"])
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


def settings(backend: str, work_root: Path, **overrides) -> SessionPoolSettings:
    options = {"backend": backend, "num_warm": 1, "max_sessions": 3, "uid_base": SESSION_UID_BASE}
    if backend == "bwrap":
        options["work_root"] = str(work_root)
    return SessionPoolSettings(**(options | overrides))


@pytest.fixture(scope="module")
def work_root():
    root = Path(tempfile.mkdtemp(prefix="session-test-"))
    root.chmod(0o711)
    yield root
    os.rmdir(root / "sandbox-bwrap") if (root / "sandbox-bwrap").exists() else None
    root.rmdir()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(backend_name, work_root):
    async with await SessionPool.create(settings(backend_name, work_root)) as pool:
        yield pool


async def test_files_persist_across_commands_but_processes_do_not(pool):
    session = await pool.acquire()
    try:
        assert (await session.exec("echo one > a.txt; sleep 30 & echo started")).stdout == "started\n"
        result = await session.exec("cat a.txt; grep -lx sleep /proc/[0-9]*/comm 2>/dev/null | wc -l; pwd")
        assert result.stdout == "one\n0\n/work\n"
        await session.write_file("dir/b.txt", b"two\n")
        assert (await session.exec("cat /work/dir/b.txt")).stdout == "two\n"
        assert (await session.read_file("/work/a.txt")).data == b"one\n"
        assert not (await session.read_file("missing.txt")).exists
    finally:
        await session.close()


async def test_exit_codes_timeouts_and_output_caps_are_reported(pool):
    session = await pool.acquire()
    try:
        failed = await session.exec("echo out; echo err >&2; exit 7")
        assert (failed.exit_code, failed.stdout, failed.stderr, failed.timed_out) == (
            7,
            "out\n",
            "err\n",
            False,
        )
        slow = await session.exec("sleep 20", timeout_s=1)
        assert slow.timed_out and slow.exit_code is None
        loud = await session.exec("yes")
        assert loud.stdout_truncated and len(loud.stdout) == SessionLimits().max_output_bytes
        assert (await session.exec("echo still usable")).stdout == "still usable\n"
    finally:
        await session.close()


async def test_reset_empties_the_session(pool):
    session = await pool.acquire()
    try:
        await session.exec("mkdir -p d/e && touch d/e/f /tmp/g && chmod 000 d")
        await session.reset()
        assert (await session.exec("ls -A /work /tmp")).stdout == "/tmp:\n\n/work:\n"
    finally:
        await session.close()


async def test_a_session_sees_neither_another_sessions_files_nor_the_hosts(pool):
    host_secret = Path(tempfile.gettempdir()) / "agentrl-host-secret.txt"
    host_secret.write_text("host secret")
    first, second = await pool.acquire(), await pool.acquire()
    try:
        await first.write_file("secret.txt", b"first's secret")
        probe = await second.exec(
            f"cat /work/secret.txt {host_secret} /etc/shadow /root/.bashrc 2>/dev/null; "
            f'grep -rlE "first\'s secret|host secret" {DATA_DIRS} 2>/dev/null; echo end',
            timeout_s=30,
        )
        assert probe.stdout == "end\n"
    finally:
        host_secret.unlink()
        await first.close()
        await second.close()


async def test_a_session_has_no_network(pool):
    session = await pool.acquire()
    try:
        result = await session.exec(
            "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\" 2>&1 | tail -1; "
            "python3 -c \"import socket; print(socket.gethostbyname('example.com'))\" 2>&1 | tail -1"
        )
        assert "Network is unreachable" in result.stdout
        assert (
            "Temporary failure in name resolution" in result.stdout
            or "Name or service not known" in result.stdout
        )
    finally:
        await session.close()


async def test_a_fork_bomb_is_contained_and_the_session_stays_usable(pool):
    session = await pool.acquire()
    try:
        await session.exec("bomb() { bomb | bomb & }; bomb", timeout_s=3)
        assert (await session.exec("echo alive")).stdout == "alive\n"
    finally:
        await session.close()


async def test_a_session_past_its_time_to_live_is_closed_by_the_pool(backend_name, work_root):
    async with await SessionPool.create(
        settings(backend_name, work_root, num_warm=0, ttl_s=1.0, uid_base=SESSION_UID_BASE + 10)
    ) as pool:
        session = await pool.acquire()
        await asyncio.sleep(2.5)
        assert pool.num_in_use == 0 and pool.num_expired == 1
        with pytest.raises(SessionFailure, match="closed"):
            await session.exec("true")


async def test_the_pool_holds_at_most_max_sessions(backend_name, work_root):
    async with await SessionPool.create(
        settings(backend_name, work_root, num_warm=0, max_sessions=2, uid_base=SESSION_UID_BASE + 20)
    ) as pool:
        first, second = await pool.acquire(), await pool.acquire()
        third = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0.5)
        assert not third.done()
        await first.close()
        session = await asyncio.wait_for(third, 30)
        await session.close()
        await second.close()
