"""What a killed process left of its bwrap sessions, found by marker and removed at the next start.

Stage: session pool start-up (host side, trusted). Docker sessions need nothing here: their
containers carry the owner's host and pid as labels and the Docker backend removes those of dead
owners when it starts. A bwrap session is host state instead: tmpfs mounts under the backend's
work root, a cgroup per session and the jail's processes. Each open bwrap session has a marker
file (owner pid and its start time, the session's dir and uid) in a root-private state dir.
A marker whose owner is gone (the pid is dead, or reused by a process that started later) is
stale: once its uid's lock is free (the kernel drops an flock with its holder, so no live
session has the uid) the uid's processes are killed, its cgroups and the session's dir removed.
A dir made just before its process died, too early for a marker, is found by its uid's free lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from sandbox.backends.cgroups import CGROUP_ROOT, GROUP_NAME, V1_CONTROLLERS, SessionCgroup
from sandbox.backends.private_dirs import private_directory
from sandbox.backends.scratch import remove_session_dir

logger = logging.getLogger(__name__)

STATE_DIR_NAME = "agentrl-sessions"
# Where the bwrap backend keeps its uid locks (sandbox.backends.bwrap): machine-wide.
UID_LOCK_DIR = Path(tempfile.gettempdir()) / "sandbox-bwrap-uids"


def state_dir(root: Path | None = None) -> Path:
    """The markers' directory: root-private, made on first use."""
    return private_directory(root or Path(tempfile.gettempdir()) / STATE_DIR_NAME, 0o700)


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@dataclass(frozen=True)
class SessionMarker:
    """One open bwrap session, as its owner wrote it down."""

    owner_pid: int
    owner_start_ticks: int
    owner_host: str
    session_root: str  # the session's dir (its tmpfs mounts inside)
    uid: int

    @classmethod
    def of_this_process(cls, session_root: Path, uid: int) -> SessionMarker:
        pid = os.getpid()
        return cls(pid, process_start_ticks(pid) or 0, socket.gethostname(), str(session_root), uid)

    @property
    def file_name(self) -> str:
        return f"{self.uid}-{Path(self.session_root).name}.json"

    def owner_alive(self) -> bool:
        if self.owner_host != socket.gethostname():
            return True  # another machine's, sharing this dir: not ours to judge
        return process_start_ticks(self.owner_pid) == self.owner_start_ticks


def write_marker(directory: Path, marker: SessionMarker) -> Path:
    path = directory / marker.file_name
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(asdict(marker)))
    temporary.replace(path)  # a reader never sees half a marker
    return path


def remove_marker(directory: Path, marker: SessionMarker) -> None:
    with contextlib.suppress(FileNotFoundError):
        (directory / marker.file_name).unlink()


def collect_leftovers(directory: Path, uid_lock_dir: Path = UID_LOCK_DIR) -> int:
    """Remove what dead owners left of their sessions; return how many sessions were collected."""
    collected = 0
    for path in sorted(directory.glob("*.json")):
        try:
            marker = SessionMarker(**json.loads(path.read_text()))
        except (ValueError, TypeError) as error:
            logger.warning("removing unreadable session marker %s: %s", path, error)
            path.unlink(missing_ok=True)
            continue
        if marker.owner_alive():
            continue
        lock = _try_lock_uid(uid_lock_dir, marker.uid)
        if lock is None:
            continue  # a live session holds the uid: its processes are not the dead owner's
        try:
            logger.warning(
                "collecting bwrap session %s left by dead process %d", marker.session_root, marker.owner_pid
            )
            kill_uid_processes(marker.uid)
            remove_uid_cgroups(marker.uid)
            if Path(marker.session_root).exists():
                remove_session_dir(Path(marker.session_root))
            path.unlink(missing_ok=True)
            collected += 1
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)
    return collected


def collect_unheld_session_dirs(work_root: Path, uid_lock_dir: Path = UID_LOCK_DIR) -> int:
    """Remove the session dirs under the bwrap backend's `work_root` whose uid no live session holds.

    The backend makes a session's dir before the pool can write its marker, so a process killed
    in between leaves a dir that no marker names. A session holds its uid's lock from before its
    dir is made until after it is removed: a dir whose uid's lock is free is left over.
    """
    collected = 0
    for path in sorted(work_root.glob("session-*-*")):
        uid_text = path.name.split("-")[1]
        if not uid_text.isdigit():
            continue
        lock = _try_lock_uid(uid_lock_dir, int(uid_text))
        if lock is None:
            continue
        try:
            if path.exists():  # a marker of the same session may have been collected meanwhile
                logger.warning("removing bwrap session dir %s, left by a process that ended", path)
                remove_session_dir(path)
                collected += 1
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)
    return collected


def _try_lock_uid(lock_dir: Path, uid: int) -> int | None:
    if not lock_dir.is_dir():
        return os.open(os.devnull, os.O_RDONLY)  # no lock dir: no backend ever ran, nothing holds it
    fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def processes_of_uid(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                if entry.stat().st_uid == uid:
                    found.append(int(entry.name))
    return found


def kill_uid_processes(uid: int) -> None:
    """SIGKILL every process of `uid` (a jail uid no live session holds)."""
    for pid in processes_of_uid(uid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def uid_cgroups(uid: int) -> list[SessionCgroup]:
    """The bwrap session cgroups made for `uid` (their cgroup.procs is chowned to it)."""
    v2_parent = CGROUP_ROOT / GROUP_NAME
    if (CGROUP_ROOT / "cgroup.controllers").exists() and v2_parent.is_dir():
        return [
            SessionCgroup(2, [directory])
            for directory in v2_parent.iterdir()
            if directory.is_dir() and (directory / "cgroup.procs").stat().st_uid == uid
        ]
    first = CGROUP_ROOT / V1_CONTROLLERS[0] / GROUP_NAME
    if not first.is_dir():
        return []
    return [
        SessionCgroup(
            1, [CGROUP_ROOT / controller / GROUP_NAME / directory.name for controller in V1_CONTROLLERS]
        )
        for directory in first.iterdir()
        if directory.is_dir() and (directory / "cgroup.procs").stat().st_uid == uid
    ]


def remove_uid_cgroups(uid: int) -> None:
    for cgroup in uid_cgroups(uid):
        cgroup.remove()
