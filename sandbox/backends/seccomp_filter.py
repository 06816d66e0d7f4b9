"""The system calls no jail may make, as a Docker seccomp profile and as a BPF filter for bwrap.

Stage: jail set-up (host side, trusted). Each denied call fails with EPERM on both backends:
calls that reach into another process (ptrace, process_vm_*, pidfd_getfd, kcmp), kernel
interfaces with a long record of exploits (io_uring, bpf, userfaultfd, perf_event_open, the
key store) and everything that changes mounts or the machine. Every capability is dropped in
both jails already; the filter also holds where a capability would not be needed.

Both forms come from one list, built by maintained code, never by hand-assembled BPF: Docker's
engine compiles the JSON profile with libseccomp; for bwrap, libseccomp's own Python binding
(Debian's python3-seccomp, for the system interpreter) exports the filter once per host into
a root-owned cache, and bwrap loads it with `--seccomp FD`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

from sandbox.backends.base import SandboxFailure

DENIED_SYSCALLS = (
    # reaching into another process: the judge, the init, a runner
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    # kernel interfaces a program never needs
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "userfaultfd", "perf_event_open",
    "keyctl", "add_key", "request_key",
    # mounts, old and new API
    "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "chroot",
    # the machine itself
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "syslog", "name_to_handle_at", "open_by_handle_at",
    "setns",
)  # fmt: skip
# Docker's architecture names per machine: the native one and the ones its CPU also runs
# (a 32-bit call on x86_64 goes through another syscall table the rules must cover too).
DOCKER_ARCHITECTURES = {
    "x86_64": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
    "aarch64": ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
}
SYSTEM_PYTHON = "/usr/bin/python3"
# Run by the system interpreter, which has libseccomp's binding: the filter as BPF on stdout.
EXPORT_SCRIPT = """
import errno, json, os, seccomp, sys
syscall_filter = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
for name in json.loads(sys.argv[1]):
    syscall_filter.add_rule(seccomp.ERRNO(errno.EPERM), name)
syscall_filter.export_bpf(sys.stdout)
"""


def docker_profile() -> str:
    """The profile as Docker's `security_opt=["seccomp=<JSON>"]` takes it (the JSON itself, not a path).

    It replaces Docker's default profile, which denies unshare: the judge of call and assert
    tests puts the program into a user and PID namespace of its own (see sandbox/harness.py).
    Mounting is still denied there, so those namespaces give the program no new view of files.
    """
    profile = {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": DOCKER_ARCHITECTURES.get(platform.machine(), []),
        "syscalls": [{"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}],
    }
    return json.dumps(profile)


def bwrap_filter(cache_root: Path | None = None) -> Path:
    """The exported BPF filter for this host (made on first use, then reused); raises SandboxFailure."""
    names = json.dumps(DENIED_SYSCALLS)
    digest = hashlib.sha256((names + EXPORT_SCRIPT).encode()).hexdigest()[:16]
    root = cache_root or Path(tempfile.gettempdir()) / "sandbox-bwrap-init"
    path = root / f"seccomp-{digest}.bpf"
    if path.exists() and path.stat().st_uid == 0:
        return path
    exported = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-c", EXPORT_SCRIPT, names], capture_output=True, check=False
    )
    if exported.returncode != 0 or not exported.stdout:
        raise SandboxFailure(
            "the bwrap backend builds its seccomp filter with libseccomp's Python binding for "
            f"{SYSTEM_PYTHON}: apt-get install -y python3-seccomp "
            f"({exported.stderr.decode(errors='replace').strip()[-300:]})"
        )
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=root, delete=False) as partial:
        partial.write(exported.stdout)
    os.chmod(partial.name, 0o644)
    os.replace(partial.name, path)  # atomic: concurrent builders each install a complete filter
    return path
