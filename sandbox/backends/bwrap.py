"""The bubblewrap backend: each run is a fresh bwrap jail over the session's private dirs.

Isolation per run: every namespace unshared (user, pid, net, ipc, uts, cgroup), a non-root uid
of its own for the whole session (sessions cannot touch each other's files, and the kernel
counts its processes apart), a read-only root with only /usr and the dynamic linker's files,
the session's own /work and /tmp (host dirs, so the host can measure the files written), a
cleared environment, rlimits, a cgroup per session where the host allows one (memory of every
process of the run and of its /dev files, pids, CPU time over all processes; exact kill-all;
emptied before every run) and a host-side wall clock that kills the jail's whole PID namespace.

Per run, the host forks once and execs bwrap: rlimits and joining the cgroup happen in the
forked child before bwrap starts. PID 1 of the jail is our init (sandbox.backends.jail_init),
which reports the program's real wait status; its absence, with bwrap's own status pipe, tells
a jail that never started (our failure) from one the host killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sandbox.backends.base import Limits, ProcessResult, SandboxFailure
from sandbox.backends.cgroups import CgroupRun, SessionCgroup
from sandbox.backends.jail_init import JAIL_INIT_PATH, build_jail_init
from sandbox.backends.process import collect_process, kill_group
from sandbox.backends.seccomp_filter import bwrap_filter
from sandbox.backends.tree import file_sizes, remove_tree
from sandbox.backends.uids import UidPool

STATUS_FD_ENV = "SANDBOX_STATUS_FD"  # as sandbox/harness.py reads it
# Just enough of /etc for the dynamic linker, locale-free Python and g++; never shadow, passwd, hosts.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "alternatives")
JAIL_PATH = "/usr/local/bin:/usr/bin:/bin"
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
PRLIMIT_OPTIONS = {
    resource.RLIMIT_CPU: "cpu", resource.RLIMIT_AS: "as", resource.RLIMIT_FSIZE: "fsize",
    resource.RLIMIT_NPROC: "nproc", resource.RLIMIT_NOFILE: "nofile", resource.RLIMIT_CORE: "core",
}  # fmt: skip


@functools.cache
def root_mounts() -> tuple[str, ...]:
    """Read-only binds of the host's system dirs (as they are on this host; looked up once)."""
    mounts = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64", "lib32", "sbin"):
        path = Path("/") / name
        if path.is_symlink():
            mounts += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            mounts += ["--ro-bind", str(path), f"/{name}"]
    for name in ETC_FILES:
        if (Path("/etc") / name).exists():
            mounts += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return tuple(mounts)


@dataclasses.dataclass(frozen=True)
class JailPaths:
    """Host paths that one jail uses: its writable dirs, our init binary and the seccomp filter."""

    work_dir: Path  # mounted at /work
    tmp_dir: Path  # mounted at /tmp; on the host, so that the host can measure what was written
    init: Path
    seccomp_filter: Path  # BPF exported by libseccomp (sandbox.backends.seccomp_filter)


def bwrap_argv(
    bwrap: str,
    paths: JailPaths,
    uid: int,
    argv: list[str],
    fds: JailFds,
    judge_process: bool = False,
) -> list[str]:
    """The bwrap command line that runs `argv` in /work of a fresh jail under our init.

    bwrap reports the jail's set-up to `fds.status`; the init reports the program's wait status
    to `fds.init_status`. A judge process (`judge_process`) is the init itself: no process of
    the namespace can signal the init, and it reports the wait status of the program it runs
    to the same fd, named in its environment.
    """
    if judge_process:
        init_argv = ["--setenv", STATUS_FD_ENV, str(fds.init_status), "--", *argv]
    else:
        init_argv = ["--", JAIL_INIT_PATH, str(fds.init_status), *argv]
    return [
        bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--as-pid-1",
        "--uid", str(uid), "--gid", str(uid), "--cap-drop", "ALL", "--disable-userns",
        "--json-status-fd", str(fds.status), "--seccomp", str(fds.seccomp),
        *root_mounts(),
        "--proc", "/proc", "--dev", "/dev", "--bind", str(paths.tmp_dir), "/tmp",
        "--bind", str(paths.work_dir), "/work", "--ro-bind", str(paths.init), JAIL_INIT_PATH,
        "--remount-ro", "/", "--chdir", "/work",
        "--clearenv", "--setenv", "PATH", JAIL_PATH, "--setenv", "HOME", "/work",
        "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONIOENCODING", "utf-8",
        *init_argv,
    ]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class JailFds:
    """The host's file descriptors that bwrap and the jail's init receive for one run."""

    status: int  # bwrap's JSON status (write end)
    init_status: int  # the program's wait status (write end)
    seccomp: int  # the BPF filter, read by bwrap before it starts the init


def rlimits(limits: Limits, max_processes: int, address_space: bool = True) -> dict[int, tuple[int, int]]:
    """(soft, hard) per resource: the soft CPU limit raises SIGXCPU, the hard one a second later SIGKILL.

    `address_space`: limit each process's address space to the memory limit, the fallback where
    no cgroup holds the run's memory (an allocation then fails inside the program, which we
    cannot tell apart from any other error: RE, not MLE).
    """
    cpu = max(1, int(limits.cpu_time_s + 0.999))
    memory = limits.memory_mb << 20 if address_space else resource.RLIM_INFINITY
    file_size = limits.max_file_size_mb << 20
    return {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: (memory, memory),
        resource.RLIMIT_FSIZE: (file_size, file_size),
        resource.RLIMIT_NPROC: (max_processes, max_processes),
        resource.RLIMIT_NOFILE: (256, 256),
        resource.RLIMIT_CORE: (0, 0),
    }


def rlimit_argv(limits: Limits, max_processes: int) -> list[str]:
    """The same rlimits as a prlimit command prefix (for backends that cannot set them in the child)."""
    options = [
        f"--{PRLIMIT_OPTIONS[resource_id]}={soft}:{hard}"
        for resource_id, (soft, hard) in rlimits(limits, max_processes).items()
    ]
    return ["prlimit", *options, "--"]


def jail_preexec(limits: dict[int, tuple[int, int]], procs_files: list[str]) -> Callable[[], None]:
    """What the forked child does (already as the jail uid) before it execs bwrap: join the cgroup, set rlimits.

    It runs between fork and exec, so it only makes system calls: no imports, no locks.
    """
    setrlimit, getpid, open_, write, close = resource.setrlimit, os.getpid, os.open, os.write, os.close

    def preexec() -> None:
        pid = b"%d" % getpid()
        for path in procs_files:  # before anything of the jail exists
            fd = open_(path, os.O_WRONLY)
            try:
                write(fd, pid)
            finally:
                close(fd)
        for resource_id, values in limits.items():
            setrlimit(resource_id, values)

    return preexec


class JailStatus:
    """bwrap's status pipe: the PID namespace's init, and the program's exit code once it was executed.

    bwrap writes the exit code only if it executed the program, so its absence proves that the
    program never ran and that whatever failed (and is on stderr) was bwrap's setup. The program
    cannot write here: bwrap closes the pipe in the jail.
    """

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self._data = bytearray()

    def close_write(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def close(self) -> None:
        self.close_write()
        os.close(self.read_fd)

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self.read_fd, 4096):
                self._data += chunk

    def _field(self, name: str) -> int | None:
        self.drain()
        for line in bytes(self._data).splitlines():
            with contextlib.suppress(ValueError):
                report = json.loads(line)
                if isinstance(report, dict) and isinstance(report.get(name), int):
                    return report[name]
        return None

    @property
    def exit_code(self) -> int | None:
        return self._field("exit-code")

    def kill_namespace(self, supervisor_pid: int) -> bool:
        """SIGKILL the jail's PID namespace init (the kernel then kills all of the namespace).

        bwrap's supervisor outlives it and reports the exit code, so the run still proves that
        its jail was set up. The init is checked to be the supervisor's child through a pidfd,
        so a recycled pid is never signalled.
        """
        pid = self._field("child-pid")
        if pid is None:
            return False
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return False
        try:
            with open(f"/proc/{pid}/stat") as stat:
                parent = int(stat.read().rpartition(")")[2].split()[1])
            if parent != supervisor_pid:
                return False
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            return True
        except (OSError, ValueError, IndexError):
            return False
        finally:
            os.close(pidfd)


class InitStatus:
    """The pipe on which our jail init reports the program's raw wait status (see jail_init.py)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)

    def close_write(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def close(self) -> None:
        self.close_write()
        os.close(self.read_fd)

    def wait_status(self) -> int | None:
        """The status, once the jail is over; None if the init never reported (it was killed)."""
        try:
            text = os.read(self.read_fd, 64)
        except BlockingIOError:
            return None
        try:
            return int(text)
        except ValueError:
            return None


def any_file_at_least(directories: tuple[Path, ...], size: int) -> bool:
    """Whether a file under `directories` reached `size`: the run hit its file size limit."""
    return any(file_size >= size for directory in directories for file_size in file_sizes(directory))


class _JailRefused(Exception):
    """The kernel refused to start the jail for now (EAGAIN): worth another try."""


class BwrapSession:
    """A private work dir owned by the session's uid; every `run` is a new jail over it."""

    def __init__(self, backend: BwrapBackend, root: Path, uid: int) -> None:
        self._backend = backend
        self.root = root
        self.paths = JailPaths(root / "work", root / "tmp", backend.init, backend.seccomp_filter)
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
        seccomp_fd = os.open(self.paths.seccomp_filter, os.O_RDONLY | os.O_CLOEXEC)
        started = time.monotonic()  # the jail's start-up counts as the run's time, as its CPU does
        try:
            fds = JailFds(status.write_fd, init_status.write_fd, seccomp_fd)
            command = bwrap_argv(self._backend.bwrap, self.paths, self.uid, argv, fds, judge_process)
            process = await self._spawn(command, preexec, (fds.status, fds.init_status, fds.seccomp))
            os.close(seccomp_fd)
            seccomp_fd = -1
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
                kill_group(process, cgroup)
                raise
            jail_started = status.exit_code is not None
            wait_status = init_status.wait_status()
        finally:
            status.close()
            init_status.close()
            if seccomp_fd >= 0:
                os.close(seccomp_fd)
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
            any_file_at_least, (self.paths.work_dir, self.paths.tmp_dir), file_limit
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
        memory = (limits.memory_mb + JAIL_OVERHEAD_MB) << 20  # every process of the run, and its /dev files
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
                await asyncio.to_thread(remove_tree, self.root)
            except OSError as error:
                failures.append(f"could not remove the session dir {self.root}: {error}")
        finally:
            # Files left behind stay in a dir only this session's jail mounted: the uid is safe to reuse.
            self._backend.uids.release(self.uid)
        if failures:
            raise SandboxFailure("; ".join(failures))


class BwrapBackend:
    """Jails made with bubblewrap; one uid from `uids` per open session."""

    name = "bwrap"

    def __init__(self, bwrap: str, uids: UidPool, work_root: Path, init: Path, seccomp_filter: Path) -> None:
        self.bwrap = bwrap
        self.uids = uids
        self.work_root = work_root
        self.init = init
        self.seccomp_filter = seccomp_filter

    @classmethod
    async def create(
        cls, uid_base: int = 61000, num_uids: int = 64, work_root: str | None = None
    ) -> BwrapBackend:
        """Check that bwrap can make a jail here; raise SandboxFailure saying what is missing."""
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
        root.mkdir(mode=0o711, exist_ok=True)
        # uid locks are machine-wide whatever the work root: two pools must never share a uid
        uid_locks = Path(tempfile.gettempdir()) / "sandbox-bwrap-uids"
        init = await asyncio.to_thread(build_jail_init)
        seccomp_filter = await asyncio.to_thread(bwrap_filter)
        return cls(bwrap, UidPool(uid_base, num_uids, uid_locks), root, init, seccomp_filter)

    async def open_session(self) -> BwrapSession:
        uid = await self.uids.acquire()
        try:
            root = Path(tempfile.mkdtemp(prefix=f"session-{uid}-", dir=self.work_root))
            os.chmod(root, 0o711)  # root's; the jail uid (running bwrap) only traverses it
            for name in ("work", "tmp"):
                os.mkdir(root / name, 0o700)
                os.chown(root / name, uid, uid)
        except OSError:
            self.uids.release(uid)
            raise
        return BwrapSession(self, root, uid)

    async def close(self) -> None:
        """Sessions clean up after themselves; nothing is pooled."""
