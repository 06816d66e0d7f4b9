"""The bubblewrap backend's command line: the jail's mounts, environment and status fds.

Every namespace is unshared, the root is read-only with only /usr and the dynamic linker's
files, the session's own /work and /tmp are bound in, the environment is cleared, and PID 1 is
our init (or the judge process itself). bwrap stacks the jail and the namespace seccomp filters
(sandbox.backends.seccomp_filter) over everything it starts, once it made the jail's namespaces:
neither the init nor the judge makes any namespace, so the program inside can make none. bwrap reports the jail's set-up on one fd and the init
the program's wait status on another (`jail_status`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

from sandbox.backends.jail_init import JAIL_INIT_PATH

STATUS_FD_ENV = "SANDBOX_STATUS_FD"  # as sandbox/harness.py reads it
# Just enough of /etc for the dynamic linker, locale-free Python and g++; never shadow, passwd, hosts.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "alternatives")
JAIL_PATH = "/usr/local/bin:/usr/bin:/bin"


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
    """Host paths that one jail uses: its writable dirs, our init binary and the seccomp filters."""

    work_dir: Path  # mounted at /work
    tmp_dir: Path  # mounted at /tmp; on the host, so that the host can measure what was written
    init: Path
    seccomp_filter: Path  # BPF exported by libseccomp (sandbox.backends.seccomp_filter)
    namespace_filter: Path  # the same, of the namespace calls


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
        "--json-status-fd", str(fds.status),
        "--add-seccomp-fd", str(fds.seccomp), "--add-seccomp-fd", str(fds.namespace_seccomp),
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
    seccomp: int  # the jail's BPF filter, read by bwrap before it starts the init
    namespace_seccomp: int  # the namespace filter, stacked on it
