"""The bubblewrap backend: each run is a fresh bwrap jail over the session's private dirs.

Isolation per run: every namespace unshared (user, pid, net, ipc, uts, cgroup), a non-root uid
of its own for the whole session (sessions cannot touch each other's files, and the kernel
counts its processes apart), a read-only root with only /usr and the dynamic linker's files,
the session's own /work and /tmp (size-limited tmpfs mounts on the host, so the host can measure
the files written: `scratch`), a cleared environment, rlimits, the jail and namespace seccomp
filters (no namespace can be made inside), a cgroup per session where the host allows one
(memory of every process of the run and of its files, pids, CPU time over all processes; exact
kill-all; emptied before every run) and a host-side wall clock that kills the jail's whole PID
namespace. The work root, the session dirs' parent, is ours and private (`private_dirs`).

Per run, the host forks once and execs bwrap: rlimits and joining the cgroup happen in the
forked child before bwrap starts. PID 1 of the jail is our init (sandbox.backends.jail_init),
which reports the program's real wait status; its absence, with bwrap's own status pipe, tells
a jail that never started (our failure) from one the host killed. The command line is
`bwrap_command`'s, the limits `rlimits`' and the status pipes `jail_status`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sandbox.backends.base import (
    SCRATCH_INODES,
    TMP_TMPFS_MB,
    WORK_TMPFS_MB,
    Limits,
    ProcessResult,
    SandboxFailure,
)
from sandbox.backends.bwrap_command import JailFds, JailPaths, bwrap_argv
from sandbox.backends.cgroups import CgroupRun, SessionCgroup
from sandbox.backends.jail_init import build_jail_init
from sandbox.backends.jail_status import InitStatus, JailStatus
from sandbox.backends.private_dirs import private_directory
from sandbox.backends.process import EXIT_GRACE_S, collect_process, kill_group
from sandbox.backends.rlimits import jail_preexec, rlimits
from sandbox.backends.scratch import (
    ScratchSizes,
    check_tmpfs_mounts,
    make_session_dirs,
    remove_session_dir,
    scratch_full,
)
from sandbox.backends.seccomp_filter import bwrap_filter, namespace_filter
from sandbox.backends.tree import remove_tree
from sandbox.backends.uids import UidPool

logger = logging.getLogger(__name__)

EXTRA_PROCESSES = 4  # bwrap's supervisor, our init and slack
# Memory of the jail's own processes (bwrap's supervisor, our init; the harness's parent for
# call and assert tests) on top of the program's limit, all in one cgroup with the program.
JAIL_OVERHEAD_MB = 24
# The kernel (6.x) releases a finished jail's share of its uid's process count lazily, so a uid
# reused at once can look busy for a while. With a pids cgroup (exact, per run) RLIMIT_NPROC is
# only a loose backstop; without one it is the limit, and a refused jail start is retried.
NPROC_BACKSTOP = 1024
SETUP_ATTEMPTS = 5
SETUP_RETRY_S = 0.05


class _JailRefused(Exception):
    """The kernel refused to start the jail for now (EAGAIN): worth another try."""


class BwrapSession:
    """A private work dir owned by the session's uid; every `run` is a new jail over it."""

    def __init__(self, backend: BwrapBackend, root: Path, uid: int) -> None:
        self._backend = backend
        self.root = root
        self.paths = JailPaths(
            root / "work", root / "tmp", backend.init, backend.seccomp_filter, backend.namespace_filter
        )
        self.work_dir = self.paths.work_dir
        self.uid = uid
        self._cgroup: SessionCgroup | None = None
        self._cgroup_tried = False

    async def write_files(self, files: dict[str, bytes]) -> None:
        for name, data in files.items():
            self._write_file(name, data)

    def _write_file(self, name: str, data: bytes) -> None:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"file name {name!r} must be a plain name inside the work dir")
        path = self.work_dir / name
        # The jail owns this dir and may have planted a symlink or hard link here: replace, never follow.
        remove_tree(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.fchown(fd, self.uid, self.uid)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    async def run(
        self, argv: list[str], stdin: bytes, limits: Limits, judge_process: bool = False
    ) -> ProcessResult:
        for attempt in range(SETUP_ATTEMPTS):
            try:
                return await self._run_once(argv, stdin, limits, judge_process)
            except _JailRefused as refused:
                if attempt == SETUP_ATTEMPTS - 1:
                    raise SandboxFailure(f"bwrap could not set up the jail: {refused}") from None
                await asyncio.sleep(SETUP_RETRY_S * 2**attempt)
        raise AssertionError("unreachable")

    async def _run_once(
        self, argv: list[str], stdin: bytes, limits: Limits, judge_process: bool
    ) -> ProcessResult:
        cgroup = self._start_cgroup_run(limits)
        max_processes = NPROC_BACKSTOP if cgroup is not None else limits.max_processes + EXTRA_PROCESSES
        process_limits = rlimits(limits, max_processes, address_space=cgroup is None)
        preexec = jail_preexec(process_limits, cgroup.cgroup.procs_files if cgroup else [])
        status, init_status = JailStatus(), InitStatus()
        filter_fds = [
            os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            for path in (self.paths.seccomp_filter, self.paths.namespace_filter)
        ]
        started = time.monotonic()  # the jail's start-up counts as the run's time, as its CPU does
        try:
            fds = JailFds(status.write_fd, init_status.write_fd, *filter_fds)
            command = bwrap_argv(self._backend.bwrap, self.paths, self.uid, argv, fds, judge_process)
            spawn_fds = (fds.status, fds.init_status, *filter_fds)
            process = await self._spawn(command, preexec, spawn_fds, status, cgroup)
            while filter_fds:
                os.close(filter_fds.pop())
            status.close_write()  # bwrap holds the only writers now: reading never waits on us
            init_status.close_write()
            try:
                result = await collect_process(
                    process,
                    stdin,
                    limits,
                    cgroup,
                    kill_jail=lambda: status.kill_namespace(process.pid),
                    started=started,
                )
            except asyncio.CancelledError:  # the caller is gone: nothing of its run may go on
                await _end_cancelled_run(process, status, cgroup)
                raise
            jail_started = status.exit_code is not None
            wait_status = init_status.wait_status()
        finally:
            status.close()
            init_status.close()
            for fd in filter_fds:
                os.close(fd)
        if wait_status is not None:  # the program ran, and this is how it ended
            return await self._judged_result(result, wait_status, limits)
        if result.timed_out or result.output_exceeded or result.memory_exceeded:
            return result  # the host (or the memory limit) ended the jail before the program did
        if jail_started:
            raise SandboxFailure(f"the jail's init ended without reporting the program's status: {result}")
        reason = result.stderr[-500:].decode(errors="replace").strip() or f"exit status {result.exit_code}"
        if "Resource temporarily unavailable" in reason:
            raise _JailRefused(reason)
        raise SandboxFailure(f"bwrap could not set up the jail: {reason}")

    async def _judged_result(self, result: ProcessResult, wait_status: int, limits: Limits) -> ProcessResult:
        """The run's result with the program's real exit status and the limits measured over the whole run."""
        code = os.waitstatus_to_exitcode(wait_status)
        exit_code, signal_number = (code, None) if code >= 0 else (None, -code)
        cpu_exhausted = signal_number == signal.SIGXCPU or result.cpu_time_s > limits.cpu_time_s
        file_limit = limits.max_file_size_mb << 20
        files_full = await asyncio.to_thread(
            scratch_full, (self.paths.work_dir, self.paths.tmp_dir), file_limit
        )
        return dataclasses.replace(
            result,
            exit_code=exit_code,
            signal=signal_number,
            timed_out=result.timed_out or cpu_exhausted,
            output_exceeded=result.output_exceeded or signal_number == signal.SIGXFSZ or files_full,
        )

    def _start_cgroup_run(self, limits: Limits) -> CgroupRun | None:
        """This run's share of the session cgroup (made on first use); None where the host has none."""
        memory = (limits.memory_mb + JAIL_OVERHEAD_MB) << 20  # every process of the run, and its files
        processes = limits.max_processes + EXTRA_PROCESSES
        if self._cgroup is None and not self._cgroup_tried:
            self._cgroup_tried = True
            self._cgroup = SessionCgroup.create(self.uid)
        if self._cgroup is None:
            return None
        try:
            return self._cgroup.start_run(memory, processes)
        except OSError:  # zombies still counted, or a memory limit the kernel cannot reclaim to: start afresh
            self._cgroup.remove()
            self._cgroup = SessionCgroup.create(self.uid)
            if self._cgroup is None:
                raise SandboxFailure("the session's cgroup could not be made again") from None
            return self._cgroup.start_run(memory, processes)

    async def _spawn(
        self,
        command: list[str],
        preexec: Callable[[], None],
        status_fds: tuple[int, ...],
        status: JailStatus,
        cgroup: CgroupRun | None,
    ) -> asyncio.subprocess.Process:
        """Start bwrap; a caller cancelled meanwhile gets its CancelledError once the run is killed.

        Cancellation must not reach asyncio's own spawn: its clean-up kills only bwrap's pid, then
        waits for the run's pipes to close. A jail can outlive its supervisor (bwrap's child sets
        --die-with-parent after the clone, too late if the supervisor is killed in between), and
        asyncio connects the pipes it had not connected yet after that clean-up, so our end of
        stdin stays open: the jail holds the pipes and that wait never ends. The spawn runs in a
        task of its own instead, and a cancelled caller kills the whole run (its PID namespace,
        bwrap's process group and the session's cgroup) before it leaves.
        """
        spawning = asyncio.ensure_future(self._start_bwrap(command, preexec, status_fds))
        try:
            return await asyncio.shield(spawning)
        except asyncio.CancelledError:
            if cgroup is not None:
                cgroup.kill()  # now: it also frees a spawn that was itself cancelled (asyncio's clean-up)
            await _wait_through_cancellation(spawning, EXIT_GRACE_S)
            if spawning.done() and not spawning.cancelled() and spawning.exception() is None:
                await _end_cancelled_run(spawning.result(), status, cgroup)
            elif not spawning.done():
                logger.warning("bwrap did not start within %ss of its caller's cancellation", EXIT_GRACE_S)
            raise

    async def _start_bwrap(
        self, command: list[str], preexec: Callable[[], None], status_fds: tuple[int, ...]
    ) -> asyncio.subprocess.Process:
        try:
            return await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                user=self.uid,
                group=self.uid,
                extra_groups=[],
                start_new_session=True,  # the jail leads its own process group: one killpg ends it
                cwd="/",
                env={"PATH": "/usr/bin:/bin"},
                preexec_fn=preexec,
                pass_fds=status_fds,
            )
        except (OSError, subprocess.SubprocessError) as error:
            raise SandboxFailure(f"cannot start bwrap: {error}") from error

    async def close(self) -> None:
        """Kill what is left, remove the work dir; the uid is released whatever fails."""
        failures = []
        try:
            if self._cgroup is not None:  # first: nothing of the session's runs may outlive it
                try:
                    await asyncio.to_thread(self._cgroup.remove)
                except OSError as error:
                    failures.append(str(error))
            try:
                await asyncio.to_thread(remove_session_dir, self.root)
            except OSError as error:
                failures.append(f"could not remove the session dir {self.root}: {error}")
        finally:
            # Files left behind stay in a dir only this session's jail mounted: the uid is safe to reuse.
            self._backend.uids.release(self.uid)
        if failures:
            raise SandboxFailure("; ".join(failures))


async def _wait_through_cancellation(future: asyncio.Future, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for `future` (never cancelling it), even if our task is cancelled again.

    For the clean-up of a cancelled run, which must finish before the caller may leave; whether
    `future` is done by then.
    """
    deadline = time.monotonic() + timeout_s
    while not future.done() and (left := deadline - time.monotonic()) > 0:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({future}, timeout=left)
    return future.done()


async def _end_cancelled_run(
    process: asyncio.subprocess.Process, status: JailStatus, cgroup: CgroupRun | None
) -> None:
    """Kill every process of a run whose caller is gone, and wait (bounded) until bwrap has exited.

    The jail's PID namespace goes first: killing bwrap alone may leave a jail whose child had not
    yet asked to die with it. The session's cgroup, where the host has one, holds every process
    of the run whatever bwrap had done so far.
    """
    status.kill_namespace(process.pid)
    kill_group(process, cgroup)
    if process.stdin is not None:
        process.stdin.close()  # what is still starting in the jail reads no more of the caller's input
    exited = asyncio.ensure_future(process.wait())  # asyncio resolves it once the run's pipes closed too
    if not await _wait_through_cancellation(exited, EXIT_GRACE_S):
        exited.cancel()
        logger.warning("bwrap (pid %d) did not exit within %ss of SIGKILL", process.pid, EXIT_GRACE_S)


class BwrapBackend:
    """Jails made with bubblewrap; one uid from `uids` per open session."""

    name = "bwrap"

    def __init__(
        self,
        bwrap: str,
        uids: UidPool,
        work_root: Path,
        init: Path,
        seccomp_filter: Path,
        namespace_filter: Path,
        scratch: ScratchSizes,
    ) -> None:
        self.bwrap = bwrap
        self.uids = uids
        self.work_root = work_root
        self.init = init
        self.seccomp_filter = seccomp_filter
        self.namespace_filter = namespace_filter
        self.scratch = scratch

    @classmethod
    async def create(
        cls,
        uid_base: int = 61000,
        num_uids: int = 64,
        work_root: str | None = None,
        work_tmpfs_mb: int = WORK_TMPFS_MB,
        tmp_tmpfs_mb: int = TMP_TMPFS_MB,
        scratch_inodes: int = SCRATCH_INODES,
    ) -> BwrapBackend:
        """Check that bwrap can make a jail here; raise SandboxFailure saying what is missing.

        `work_tmpfs_mb`, `tmp_tmpfs_mb`, `scratch_inodes`: each session's /work and /tmp, as the
        Docker backend's options of the same names.
        """
        scratch = ScratchSizes(work_tmpfs_mb, tmp_tmpfs_mb, scratch_inodes)
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxFailure("bubblewrap is not installed: apt-get install -y bubblewrap")
        if os.geteuid() != 0:
            raise SandboxFailure("the bwrap backend runs jails under their own uids and must start as root")
        root = Path(work_root or tempfile.gettempdir()).resolve() / "sandbox-bwrap"
        for parent in reversed(root.parents):
            if not parent.stat().st_mode & 0o001:
                raise ValueError(
                    f"work_root {work_root!r}: jail uids cannot traverse {parent} (mode "
                    f"{parent.stat().st_mode & 0o777:o}); choose a work_root whose parents are world-executable"
                )
        # Ours alone: another user who made it first could swap a session's files. Jail uids
        # (bwrap runs as one) traverse it to their session's dir, nothing more.
        private_directory(root, 0o711)
        check_tmpfs_mounts(root)  # at start-up, not at the first session
        # uid locks are machine-wide whatever the work root: two pools must never share a uid
        uid_locks = Path(tempfile.gettempdir()) / "sandbox-bwrap-uids"
        init = await asyncio.to_thread(build_jail_init)
        seccomp_filter = await asyncio.to_thread(bwrap_filter)
        namespaces = await asyncio.to_thread(namespace_filter)
        uids = UidPool(uid_base, num_uids, uid_locks)
        return cls(bwrap, uids, root, init, seccomp_filter, namespaces, scratch)

    async def open_session(self) -> BwrapSession:
        uid = await self.uids.acquire()
        try:
            self._remove_stale_sessions(uid)
            root = Path(tempfile.mkdtemp(prefix=f"session-{uid}-", dir=self.work_root))
        except OSError:
            self.uids.release(uid)
            raise
        try:
            os.chmod(root, 0o711)  # root's; the jail uid (running bwrap) only traverses it
            make_session_dirs(root, uid, self.scratch)
        except BaseException:
            try:
                remove_session_dir(root)
            finally:
                self.uids.release(uid)
            raise
        return BwrapSession(self, root, uid)

    def _remove_stale_sessions(self, uid: int) -> None:
        """Unmount and remove what a killed process left of `uid`'s sessions.

        A session holds its uid's lock for as long as it is open, and we hold it now: any
        session dir of this uid belongs to a process that died without closing it (its tmpfs
        mounts would otherwise hold their memory until the host reboots).
        """
        for stale in self.work_root.glob(f"session-{uid}-*"):
            logger.warning("removing %s, left by a sandbox process that ended without closing it", stale)
            remove_session_dir(stale)

    async def close(self) -> None:
        """Sessions clean up after themselves; nothing is pooled."""
