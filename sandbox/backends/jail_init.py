"""PID 1 of every bwrap jail: runs the program and reports its real wait status to the host.

bwrap's own init reports a program killed by signal N as exit code 128 + N, so `exit(137)`
and a SIGKILL look alike, and it reports through a channel that runs as the program's uid.
This init is ours: bwrap starts it as the PID namespace's first process (`--as-pid-1`), so the
kernel shields it from every signal the program could send, and it makes itself non-dumpable
so that the program (same uid) cannot ptrace it or read its memory. It forks the program,
waits for it, and writes the raw wait status (decimal) to a pipe whose write end the program
never holds (close-on-exec). When the init exits, the kernel kills whatever the program left.

It is a few lines of C, compiled once per host into a root-owned cache, because a Python init
would add an interpreter start-up (about 15 ms) to every run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from sandbox.backends.base import SandboxFailure
from sandbox.backends.private_dirs import cache_directory

JAIL_INIT_PATH = "/.sandbox-init"  # where the binary is mounted inside the jail
EXEC_FAILED_EXIT_CODE = 127  # what a shell reports for a command it cannot execute

SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* argv: jail-init STATUS_FD PROGRAM [ARGS...] */
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int status_fd = atoi(argv[1]);
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return 2;
    if (fcntl(status_fd, F_SETFD, FD_CLOEXEC) != 0) return 2;
    pid_t program = fork();
    if (program < 0) return 2;
    if (program == 0) {
        execvp(argv[2], argv + 2);
        dprintf(2, "cannot execute %s: %s\n", argv[2], strerror(errno));
        _exit(127);
    }
    int status = 0;
    for (;;) { /* orphans of the program are ours to reap too */
        pid_t pid = wait(&status);
        if (pid == program) break;
        if (pid < 0 && errno != EINTR) return 2;
    }
    char text[16];
    int length = snprintf(text, sizeof text, "%d\n", status);
    if (write(status_fd, text, length) != length) return 2;
    return 0;
}
"""


def build_jail_init(cache_root: Path | None = None) -> Path:
    """The compiled init for this host (built on first use, then reused); raises SandboxFailure."""
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    root = cache_directory(cache_root)  # bwrap, running as a jail uid, traverses it to mount the binary
    binary = root / f"jail-init-{digest}"
    if binary.exists() and binary.stat().st_uid == 0:
        return binary
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SandboxFailure(
            "the bwrap backend compiles its jail init with a C compiler: apt-get install -y gcc"
        )
    with tempfile.TemporaryDirectory(dir=root) as build_dir:
        source = Path(build_dir) / "jail_init.c"
        source.write_text(SOURCE)
        output = Path(build_dir) / "jail-init"
        compiled = subprocess.run(
            [compiler, "-O2", "-o", str(output), str(source)], capture_output=True, text=True, check=False
        )
        if compiled.returncode != 0:
            raise SandboxFailure(f"compiling the jail init failed: {compiled.stderr.strip()[-500:]}")
        output.chmod(0o755)
        os.replace(output, binary)  # atomic: concurrent builders each install a complete binary
    return binary
