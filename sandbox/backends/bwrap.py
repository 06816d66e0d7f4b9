"""The bubblewrap backend: each run is a fresh bwrap jail over the session's private work dir.

Isolation per run: every namespace unshared (user, pid, net, ipc, uts, cgroup), a non-root uid
of its own for the whole session (sessions cannot touch each other's files, and the kernel
counts its processes apart), a read-only root with only /usr and the dynamic linker's files,
a private size-capped /tmp, a cleared environment, rlimits, a per-run cgroup where the host
allows one (total memory, pids, CPU time; exact kill-all) and a host-side wall clock that
kills the whole jail.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import shlex
import shutil
import tempfile
from pathlib import Path

from sandbox.backends.base import Limits, ProcessResult, SandboxFailure
from sandbox.backends.cgroups import RunCgroup
from sandbox.backends.process import collect_process
from sandbox.backends.uids import UidPool

# Just enough of /etc for the dynamic linker, locale-free Python and g++; never shadow, passwd, hosts.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "alternatives")
JAIL_PATH = "/usr/local/bin:/usr/bin:/bin"
TMP_SIZE_BYTES = 64 << 20  # the private /tmp is RAM: keep it small
EXTRA_PROCESSES = 4  # bwrap's own two processes, the cgroup-joining shell, slack
# The kernel (6.x) releases a finished jail's share of its uid's process count lazily, so a uid
# reused at once can look busy for a while. With a pids cgroup (exact, per run) RLIMIT_NPROC is
# only a loose backstop; without one it is the limit, and a refused jail start is retried.
NPROC_BACKSTOP = 1024
SETUP_ATTEMPTS = 5
SETUP_RETRY_S = 0.05


def bwrap_argv(bwrap: str, work_dir: Path, uid: int, argv: list[str]) -> list[str]:
    """The bwrap command line that runs `argv` in /work of a fresh jail."""
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
    return [
        bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
        "--uid", str(uid), "--gid", str(uid), "--cap-drop", "ALL", "--disable-userns",
        *mounts,
        "--proc", "/proc", "--dev", "/dev", "--size", str(TMP_SIZE_BYTES), "--tmpfs", "/tmp",
        "--bind", str(work_dir), "/work", "--remount-ro", "/", "--chdir", "/work",
        "--clearenv", "--setenv", "PATH", JAIL_PATH, "--setenv", "HOME", "/work",
        "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONIOENCODING", "utf-8",
        "--", *argv,
    ]  # fmt: skip


def rlimit_argv(limits: Limits, max_processes: int) -> list[str]:
    """prlimit options: soft CPU limit raises SIGXCPU, the hard one a second later SIGKILL."""
    cpu = max(1, int(limits.cpu_time_s + 0.999))
    memory = limits.memory_mb << 20
    file_size = limits.max_file_size_mb << 20
    return [
        "prlimit", f"--cpu={cpu}:{cpu + 1}", f"--as={memory}", f"--fsize={file_size}",
        f"--nproc={max_processes}", "--nofile=256", "--core=0", "--",
    ]  # fmt: skip


class _JailRefused(Exception):
    """The kernel refused to start the jail for now (EAGAIN): worth another try."""


class BwrapSession:
    """A private work dir owned by the session's uid; every `run` is a new jail over it."""

    def __init__(self, backend: BwrapBackend, work_dir: Path, uid: int) -> None:
        self._backend = backend
        self.work_dir = work_dir
        self.uid = uid

    async def write_files(self, files: dict[str, bytes]) -> None:
        for name, data in files.items():
            self._write_file(name, data)

    def _write_file(self, name: str, data: bytes) -> None:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"file name {name!r} must be a plain name inside the work dir")
        path = self.work_dir / name
        # The jail owns this dir and may have planted a symlink or hard link here: replace, never follow.
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.fchown(fd, self.uid, self.uid)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    async def run(self, argv: list[str], stdin: bytes, limits: Limits) -> ProcessResult:
        for attempt in range(SETUP_ATTEMPTS):
            try:
                return await self._run_once(argv, stdin, limits)
            except _JailRefused as refused:
                if attempt == SETUP_ATTEMPTS - 1:
                    raise SandboxFailure(f"bwrap could not set up the jail: {refused}") from None
                await asyncio.sleep(SETUP_RETRY_S * 2**attempt)
        raise AssertionError("unreachable")

    async def _run_once(self, argv: list[str], stdin: bytes, limits: Limits) -> ProcessResult:
        cgroup_memory = (limits.memory_mb << 20) * 2 + (64 << 20)  # two processes (harness) and slack
        cgroup = RunCgroup.create(cgroup_memory, limits.max_processes + EXTRA_PROCESSES, self.uid)
        max_processes = NPROC_BACKSTOP if cgroup is not None else limits.max_processes + EXTRA_PROCESSES
        # The first stderr line proves that the jail was set up: without it, bwrap failed (our
        # failure, not the program's). The program cannot unprint it nor print it for a failed setup.
        started = f"sandbox-jail-started {secrets.token_hex(8)}\n".encode()
        jailed = ["/bin/sh", "-c", f'printf "{started.decode().strip()}\\n" >&2 && exec "$@"', "sh", *argv]
        command = rlimit_argv(limits, max_processes) + bwrap_argv(
            self._backend.bwrap, self.work_dir, self.uid, jailed
        )
        if cgroup is not None:  # join the cgroup before anything of the jail exists
            joins = " && ".join(f"echo $$ > {shlex.quote(path)}" for path in cgroup.procs_files)
            command = ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh", *command]
        try:
            process = await self._spawn(command)
            result = await collect_process(process, stdin, limits, cgroup)
        finally:
            if cgroup is not None:
                await asyncio.to_thread(cgroup.remove)
        if not result.stderr.startswith(started):
            reason = (
                result.stderr[-500:].decode(errors="replace").strip() or f"exit status {result.exit_code}"
            )
            if "Resource temporarily unavailable" in reason:
                raise _JailRefused(reason)
            raise SandboxFailure(f"bwrap could not set up the jail: {reason}")
        return dataclasses.replace(result, stderr=result.stderr[len(started) :])

    async def _spawn(self, command: list[str]) -> asyncio.subprocess.Process:
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
            )
        except OSError as error:
            raise SandboxFailure(f"cannot start bwrap: {error}") from error

    async def close(self) -> None:
        await asyncio.to_thread(shutil.rmtree, self.work_dir, ignore_errors=True)
        self._backend.uids.release(self.uid)
        if self.work_dir.exists():
            raise SandboxFailure(f"could not remove the session dir {self.work_dir}")


class BwrapBackend:
    """Jails made with bubblewrap; one uid from `uids` per open session."""

    name = "bwrap"

    def __init__(self, bwrap: str, uids: UidPool, work_root: Path) -> None:
        self.bwrap = bwrap
        self.uids = uids
        self.work_root = work_root

    @classmethod
    async def create(
        cls, uid_base: int = 61000, num_uids: int = 64, work_root: str | None = None
    ) -> BwrapBackend:
        """Check that bwrap can make a jail here; raise SandboxFailure saying what is missing."""
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxFailure("bubblewrap is not installed: apt-get install -y bubblewrap")
        if shutil.which("prlimit") is None:
            raise SandboxFailure("prlimit is not installed: apt-get install -y util-linux")
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
        return cls(bwrap, UidPool(uid_base, num_uids, uid_locks), root)

    async def open_session(self) -> BwrapSession:
        uid = await self.uids.acquire()
        try:
            work_dir = Path(tempfile.mkdtemp(prefix=f"session-{uid}-", dir=self.work_root))
            os.chown(work_dir, uid, uid)
            os.chmod(work_dir, 0o700)
        except OSError:
            self.uids.release(uid)
            raise
        return BwrapSession(self, work_dir, uid)

    async def close(self) -> None:
        """Sessions clean up after themselves; nothing is pooled."""
