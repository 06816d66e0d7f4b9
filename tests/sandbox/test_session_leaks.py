"""100 episodes per backend, with injected crashes, Ctrl-C and a killed trainer: nothing is left behind.

Counts after each run: containers labelled with the trainer's pid (Docker); session dirs, markers,
processes and cgroups of the session uids (bwrap). A killed trainer's sessions are collected by
the next pool's start.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker
import pytest

from sandbox.backends.docker_container import OWNER_PID_LABEL
from sandbox.sessions import SessionPool, leftovers
from tests.sandbox import session_trainer

pytestmark = pytest.mark.slow
TRAINER = Path(session_trainer.__file__)
UIDS = range(
    session_trainer.SESSION_UID_BASE, session_trainer.SESSION_UID_BASE + session_trainer.MAX_SESSIONS
)


def left_behind(backend: str, work_root: Path, pid: int) -> dict[str, list[str]]:
    if backend == "docker":
        client = docker.from_env()
        try:
            containers = client.containers.list(all=True, filters={"label": f"{OWNER_PID_LABEL}={pid}"})
        finally:
            client.close()
        return {"containers": [container.short_id for container in containers]}
    markers = [
        path.name for path in leftovers.state_dir().glob("*.json")
        if json.loads(path.read_text())["owner_pid"] == pid
    ]  # fmt: skip
    return {
        "session dirs": sorted(path.name for path in (work_root / "sandbox-bwrap").glob("session-*")),
        "markers": markers,
        "processes": [str(p) for uid in UIDS for p in leftovers.processes_of_uid(uid)],
        "cgroups": [str(c.directories[0]) for uid in UIDS for c in leftovers.uid_cgroups(uid)],
    }


def left_behind_after_settling(backend: str, work_root: Path, pid: int) -> dict[str, list[str]]:
    """What is left once the jails' last processes had a moment to exit (the kernel reaps them)."""
    deadline = time.monotonic() + 5.0
    while (found := left_behind(backend, work_root, pid)) != nothing(backend) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def wait_or_dump(process: subprocess.Popen[str], timeout_s: float) -> int:
    """The trainer's exit status; past `timeout_s`, fail with the stacks of its tasks."""
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGUSR2)  # session_trainer prints every task's stack
        time.sleep(1)
        process.kill()
        pytest.fail(f"the trainer did not exit within {timeout_s} s:\n{process.stderr.read()[-4000:]}")


def nothing(backend: str) -> dict[str, list[str]]:
    if backend == "docker":
        return {"containers": []}
    return {"session dirs": [], "markers": [], "processes": [], "cgroups": []}


_trainers: list[subprocess.Popen[str]] = []


def start_trainer(backend: str, work_root: Path, mode: str, num_episodes: int) -> subprocess.Popen[str]:
    _trainers.append(process := _popen(backend, work_root, mode, num_episodes))
    return process


def _popen(backend: str, work_root: Path, mode: str, num_episodes: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(TRAINER), backend, str(work_root), mode, str(num_episodes)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )  # fmt: skip


def wait_ready(process: subprocess.Popen[str]) -> None:
    line = process.stdout.readline()
    assert line == "READY\n", (
        f"trainer did not get ready: {line!r} {process.stderr.read() if process.poll() is not None else ''}"
    )


@pytest.fixture(params=["bwrap", "docker"])
def backend(request):
    return request.param


@pytest.fixture
def work_root():
    root = Path(tempfile.mkdtemp(prefix="session-leaks-"))
    root.chmod(0o711)
    yield root
    while _trainers:  # a failed check must not leave a trainer running
        trainer = _trainers.pop()
        trainer.kill()
        trainer.wait()
    for path in root.glob("*"):
        path.rmdir()
    root.rmdir()


def test_a_hundred_episodes_with_crashes_interrupts_and_a_kill_leave_nothing(backend, work_root):
    finished = start_trainer(backend, work_root, "finish", 40)  # 8 of them crash mid-episode
    assert wait_or_dump(finished, 300) == 0, finished.stderr.read()
    assert left_behind_after_settling(backend, work_root, finished.pid) == nothing(backend)

    crashed = start_trainer(backend, work_root, "crash", 20)
    assert wait_or_dump(crashed, 300) == 1
    assert "injected crash of the whole run" in crashed.stderr.read()
    assert left_behind_after_settling(backend, work_root, crashed.pid) == nothing(backend)

    interrupted = start_trainer(backend, work_root, "wait", 20)
    wait_ready(interrupted)
    interrupted.send_signal(signal.SIGINT)  # Ctrl-C
    assert wait_or_dump(interrupted, 60) != 0
    assert "KeyboardInterrupt" in interrupted.stderr.read()
    assert left_behind_after_settling(backend, work_root, interrupted.pid) == nothing(backend)

    killed = start_trainer(backend, work_root, "wait", 20)
    wait_ready(killed)
    killed.kill()
    killed.wait(30)
    assert left_behind(backend, work_root, killed.pid) != nothing(backend)  # the kill left sessions

    async def next_start() -> None:
        pool = await SessionPool.create(session_trainer.pool_settings(backend, str(work_root)))
        await pool.close()

    asyncio.run(next_start())
    assert left_behind_after_settling(backend, work_root, killed.pid) == nothing(backend)
