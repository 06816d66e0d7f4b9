"""The system calls no jail may make, and the namespace calls no program may make, as seccomp filters.

Stage: jail set-up (host side, trusted). Two filters, both failing each denied call with EPERM:

- the jail filter, over everything in a jail: calls that reach into another process (ptrace,
  process_vm_*, pidfd_getfd, kcmp), kernel interfaces with a long record of exploits (io_uring,
  bpf, userfaultfd, perf_event_open, the key store) and everything that changes mounts or the
  machine. Docker takes it as a JSON profile (its engine compiles it with libseccomp); bwrap
  loads it as BPF.
- the namespace filter, stacked on it for the program: no namespace can be made or entered
  (unshare, setns, clone with a CLONE_NEW* flag). A new user namespace would give the program
  every capability inside it (network administration, nf_tables, mounts of its own). The jail's
  own namespaces are made before the filter is loaded: by bwrap, which loads it with the jail
  filter; in Docker by the in-jail runner (sandbox/image/runner.py), which loads it in every
  process it starts, after it made the judge's namespaces, right before exec. clone3 passes
  its flags in memory that seccomp cannot read, so it fails with ENOSYS and the C library falls
  back to clone, whose flags the filter does read.

Every capability is dropped in both jails already; the filters also hold where a capability
would not be needed. Both come from the lists below, built by maintained code, never by
hand-assembled BPF: libseccomp's own Python binding (Debian's python3-seccomp, for the system
interpreter) exports each BPF filter once per host into a root-owned cache.
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
from sandbox.backends.private_dirs import cache_directory

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
)  # fmt: skip
# The namespace filter. Names of calls that always fail with EPERM:
NAMESPACE_SYSCALLS = ("unshare", "setns")
# clone fails with EPERM when its flags (its first argument) hold any of these. CLONE_NEWTIME is
# only honoured by unshare and clone3; for clone it lies in the exit signal's bits, where no
# valid signal sets it.
NAMESPACE_CLONE_FLAGS = {
    "CLONE_NEWTIME": 0x00000080, "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000, "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000, "CLONE_NEWNET": 0x40000000,
}  # fmt: skip
# Calls that fail with ENOSYS, as if the kernel lacked them, so that libc uses its fallback.
UNSUPPORTED_SYSCALLS = ("clone3",)
# Docker's architecture names per machine: the native one and the ones its CPU also runs
# (a 32-bit call on x86_64 goes through another syscall table the rules must cover too).
DOCKER_ARCHITECTURES = {
    "x86_64": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
    "aarch64": ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
}
SYSTEM_PYTHON = "/usr/bin/python3"
# Run by the system interpreter, which has libseccomp's binding: the filter as BPF on stdout.
# Each rule is [name, errno, flag]: the call fails with errno, only when its first argument has
# the flag's bits set if flag is not null.
EXPORT_SCRIPT = """
import json, seccomp, sys
syscall_filter = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
for name, error, flag in json.loads(sys.argv[1]):
    if flag is None:
        syscall_filter.add_rule(seccomp.ERRNO(error), name)
    else:
        syscall_filter.add_rule(seccomp.ERRNO(error), name, seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
syscall_filter.export_bpf(sys.stdout)
"""
Rule = tuple[str, int, int | None]  # (system call, errno it fails with, flag it fails on or None)


def docker_profile() -> str:
    """The jail filter as Docker's `security_opt=["seccomp=<JSON>"]` takes it (the JSON itself, not a path).

    It replaces Docker's default profile, which denies unshare: the runner makes a user and PID
    namespace for the judge of call and assert tests (see sandbox/harness.py). Everything the
    runner starts, the judge included, runs under the namespace filter besides.
    """
    profile = {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": DOCKER_ARCHITECTURES.get(platform.machine(), []),
        "syscalls": [{"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}],
    }
    return json.dumps(profile)


def jail_rules() -> list[Rule]:
    """The jail filter: every call of DENIED_SYSCALLS fails with EPERM."""
    return [(name, errno.EPERM, None) for name in DENIED_SYSCALLS]


def namespace_rules() -> list[Rule]:
    """The namespace filter: unshare, setns, clone making a namespace (EPERM); clone3 (ENOSYS)."""
    rules: list[Rule] = [(name, errno.EPERM, None) for name in NAMESPACE_SYSCALLS]
    # libseccomp compares an argument with one mask and value: one rule per flag is "any of them".
    rules += [("clone", errno.EPERM, flag) for flag in NAMESPACE_CLONE_FLAGS.values()]
    return rules + [(name, errno.ENOSYS, None) for name in UNSUPPORTED_SYSCALLS]


def bwrap_filter(cache_root: Path | None = None) -> Path:
    """The jail filter as BPF for this host (made on first use, then reused); raises SandboxFailure."""
    return export_filter("seccomp", jail_rules(), cache_root)


def namespace_filter(cache_root: Path | None = None) -> Path:
    """The namespace filter as BPF for this host (made on first use, then reused); raises SandboxFailure."""
    return export_filter("namespaces", namespace_rules(), cache_root)


def export_filter(name: str, rules: list[Rule], cache_root: Path | None = None) -> Path:
    """`rules` exported as a BPF filter into the root-owned cache; raises SandboxFailure."""
    rules_json = json.dumps(rules)
    digest = hashlib.sha256((rules_json + EXPORT_SCRIPT).encode()).hexdigest()[:16]
    root = cache_directory(cache_root)
    path = root / f"{name}-{digest}.bpf"
    if path.exists() and path.stat().st_uid == 0:
        return path
    exported = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-c", EXPORT_SCRIPT, rules_json], capture_output=True, check=False
    )
    if exported.returncode != 0 or not exported.stdout:
        raise SandboxFailure(
            "the sandbox builds its seccomp filters with libseccomp's Python binding for "
            f"{SYSTEM_PYTHON}: apt-get install -y python3-seccomp "
            f"({exported.stderr.decode(errors='replace').strip()[-300:]})"
        )
    with tempfile.NamedTemporaryFile(dir=root, delete=False) as partial:
        partial.write(exported.stdout)
    os.chmod(partial.name, 0o644)
    os.replace(partial.name, path)  # atomic: concurrent builders each install a complete filter
    return path
