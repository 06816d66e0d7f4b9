"""Resource limits of one jailed run: rlimits set in the forked child, or a prlimit command prefix.

The forked child also joins the run's cgroup before it execs the jail, so that nothing of the
jail exists outside it.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable

from sandbox.backends.base import Limits

PRLIMIT_OPTIONS = {
    resource.RLIMIT_CPU: "cpu", resource.RLIMIT_AS: "as", resource.RLIMIT_FSIZE: "fsize",
    resource.RLIMIT_NPROC: "nproc", resource.RLIMIT_NOFILE: "nofile", resource.RLIMIT_CORE: "core",
}  # fmt: skip


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
